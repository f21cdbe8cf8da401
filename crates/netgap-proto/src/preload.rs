//! The setup exchange of netgap's preload sockets library, as plain codecs
//! (no I/O): the small fixed-size, little-endian records the library's two
//! ends exchange over a fresh kernel TCP connection, and the names of the
//! abstract Unix sockets they find each other by. Every decoder refuses
//! anything a peer could send that the library must not act on.
//!
//! Same host (kind shm):
//!
//! 1. The listener announces its port with a *beacon*, a listening Unix
//!    socket named [`beacon_name`] whose owner the kernel vouches for
//!    (`SO_PEERCRED`); a connector checks it before anything goes on the
//!    wire.
//! 2. The connector makes the shared region (a sealed memfd), binds the
//!    connection's *mailbox* (a listening Unix socket named after its TCP
//!    socket's inode, [`mailbox_name`], which the listener learns from the
//!    kernel), connects, and sends its [`Hello`].
//! 3. The listener learns who the connector is from the kernel, not from
//!    the hello: the mailbox's owner (`SO_PEERPIDFD`, `SO_PEERCRED`: a
//!    process of the listener's own user) and the TCP peer's socket (the
//!    kernel's socket diagnostics: its owner and inode). It takes the
//!    region from that process (`pidfd_getfd`; the hello's descriptor
//!    number only says which of that process's descriptors to look at),
//!    checks it (a sealed memfd of the library's, of the listener's user,
//!    of the announced size, whose header names the TCP peer's socket,
//!    joined to no other connection), maps it and answers
//!    [`Answer::Accepted`]; or refuses, and the connector sends what its
//!    program wrote meanwhile over the kernel's TCP.
//!
//! Across hosts (kind relay), the hello carries a connection key the
//! connector drew at random: each end shares its region with its own
//! host's relay (`netgap relay`), the listener's relay listens for the
//! connection and the answer names where (`IP/MAC/FLOW`); the relays match
//! the connection by the key. The key travels in the clear over the
//! kernel's TCP connection: it identifies a connection, it authenticates
//! nothing (the relays' own key keys their link).

use thiserror::Error;

/// First eight bytes of a hello.
pub const HELLO_MAGIC: [u8; 8] = *b"NGPRELD\0";
/// First eight bytes of an answer.
pub const ANSWER_MAGIC: [u8; 8] = *b"NGPRELA\0";
/// Version of the exchange and of the shared region's layout (4: the
/// listener takes the region from the process the kernel says is the
/// connector).
pub const PRELOAD_VERSION: u16 = 4;
/// Bytes of the longest hello on the wire (a relay hello).
pub const HELLO_BYTES: usize = 52;
/// Bytes of a same-host hello on the wire.
pub const SHM_HELLO_BYTES: usize = 24;
/// Bytes of the longest answer on the wire (one naming a relay's target).
pub const ANSWER_BYTES: usize = 80;
/// Bytes of an answer that carries nothing but its code.
pub const SHORT_ANSWER_BYTES: usize = 16;
/// Bytes that tell a record's length ([`hello_bytes`], [`answer_bytes`]).
pub const LENGTH_PREFIX_BYTES: usize = 12;
/// Bytes of the connection key a relay hello carries.
pub const RELAY_KEY_BYTES: usize = 32;
/// Longest xdp target (`IP/MAC/FLOW`) an answer carries.
pub const MAX_TARGET_BYTES: usize = 64;
/// Smallest ring capacity a hello may name (one page).
pub const MIN_RING_BYTES: u32 = 4096;
/// Largest ring capacity a hello may name (64 MiB).
pub const MAX_RING_BYTES: u32 = 64 << 20;

/// The abstract Unix socket name (without its leading NUL) of the beacon
/// of a listener of user `uid` on TCP port `port` of IP version `family`
/// (4 or 6).
pub fn beacon_name(uid: u32, family: u8, port: u16) -> String {
    format!("netgap-preload.{uid}.{family}.{port}")
}

/// The abstract Unix socket name (without its leading NUL) of the mailbox
/// of the TCP connection whose connector's socket has inode
/// `connector_socket_inode`: unique among the sockets of a host, known to
/// the connector before it connects (`fstat` of its socket) and to the
/// listener from the kernel (its socket diagnostics of the connection's
/// other end), never from the wire.
pub fn mailbox_name(connector_socket_inode: u64) -> String {
    format!("netgap-preload.m.{connector_socket_inode:x}")
}

/// A connector's hello: same host ([`Hello::Shm`]), or through the hosts'
/// relays ([`Hello::Relay`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// The connector's region is ready to be taken.
    Shm {
        /// Bytes of each ring's data region: a power of two between
        /// [`MIN_RING_BYTES`] and [`MAX_RING_BYTES`].
        ring_bytes: u32,
        /// Which of the connector's descriptors is the region: a hint,
        /// used only on the process the kernel says is the connector, and
        /// only for what the kernel then says that descriptor is.
        region_fd: u32,
    },
    /// "xdp via relay", with the key that names the connection to the
    /// relays.
    Relay {
        /// As for [`Hello::Shm`].
        ring_bytes: u32,
        /// Random bytes the connector drew.
        key: [u8; RELAY_KEY_BYTES],
    },
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key's bytes never appear in a log.
        match self {
            Hello::Shm {
                ring_bytes,
                region_fd,
            } => write!(
                f,
                "Hello::Shm {{ ring_bytes: {ring_bytes}, region_fd: {region_fd} }}"
            ),
            Hello::Relay { ring_bytes, .. } => {
                write!(f, "Hello::Relay {{ ring_bytes: {ring_bytes} }}")
            }
        }
    }
}

impl Hello {
    /// Bytes of each ring the hello names.
    pub fn ring_bytes(&self) -> u32 {
        match self {
            Hello::Shm { ring_bytes, .. } | Hello::Relay { ring_bytes, .. } => *ring_bytes,
        }
    }
}

/// The kind field of a hello: a region on this host.
const KIND_SHM: u16 = 0;
/// The kind field of a hello: xdp through the hosts' relays.
const KIND_RELAY: u16 = 1;
/// The code of an answer naming the listener relay's xdp target.
const CODE_RELAY: u16 = 100;

/// The listener's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The listener mapped the region: the connection moves to it.
    Accepted,
    /// The listener's relay listens for the connection's xdp flow at this
    /// target (`IP/MAC/FLOW`, printable ASCII, at most
    /// [`MAX_TARGET_BYTES`]).
    Relay(String),
    /// The listener will not take the connection over (the code says why,
    /// see [`Refusal`]); it stays on the kernel's TCP.
    Refused(Refusal),
}

/// Why a listener refused a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The hello did not decode.
    BadHello,
    /// The connector could not be reached (no mailbox, a process gone),
    /// or the kernel would not let its region be taken.
    Unreachable,
    /// The region was not what the hello said (size, owner, seals, a
    /// region already joined to a connection).
    BadRegion,
    /// No relay runs on the listener's host, or it refused.
    NoRelay,
    /// The connector is another user than the listener.
    OtherUser,
    /// A code this version does not know.
    Other(u16),
}

impl Refusal {
    fn code(self) -> u16 {
        match self {
            Refusal::BadHello => 1,
            Refusal::Unreachable => 2,
            Refusal::BadRegion => 3,
            Refusal::NoRelay => 4,
            Refusal::OtherUser => 5,
            Refusal::Other(c) => c,
        }
    }

    fn from_code(code: u16) -> Refusal {
        match code {
            1 => Refusal::BadHello,
            2 => Refusal::Unreachable,
            3 => Refusal::BadRegion,
            4 => Refusal::NoRelay,
            5 => Refusal::OtherUser,
            c => Refusal::Other(c),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::BadHello => f.write_str("the hello did not decode"),
            Refusal::Unreachable => f.write_str("the connector's region could not be taken"),
            Refusal::BadRegion => f.write_str("the shared region is not as announced"),
            Refusal::NoRelay => f.write_str("no relay on the listener's host took the connection"),
            Refusal::OtherUser => f.write_str("the connector is another user"),
            Refusal::Other(c) => write!(f, "refusal code {c}"),
        }
    }
}

/// Why bytes are not a record of the exchange.
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
    #[error("preload setup field {field} is {value}, outside what is allowed")]
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
/// bytes).
pub fn could_be_hello(bytes: &[u8]) -> bool {
    let n = bytes.len().min(HELLO_MAGIC.len());
    bytes[..n] == HELLO_MAGIC[..n]
}

/// The length of the hello that `prefix` starts, once it holds
/// [`LENGTH_PREFIX_BYTES`] (None before): [`HELLO_BYTES`] for a relay
/// hello, else [`SHM_HELLO_BYTES`].
pub fn hello_bytes(prefix: &[u8]) -> Option<usize> {
    (prefix.len() >= LENGTH_PREFIX_BYTES).then(|| {
        if u16_at(prefix, 10) == KIND_RELAY {
            HELLO_BYTES
        } else {
            SHM_HELLO_BYTES
        }
    })
}

/// The length of the answer that `prefix` starts, once it holds
/// [`LENGTH_PREFIX_BYTES`] (None before).
pub fn answer_bytes(prefix: &[u8]) -> Option<usize> {
    (prefix.len() >= LENGTH_PREFIX_BYTES).then(|| match u16_at(prefix, 10) {
        CODE_RELAY => ANSWER_BYTES,
        _ => SHORT_ANSWER_BYTES,
    })
}

/// Whether `bytes` could be the start of an answer.
pub fn could_be_answer(bytes: &[u8]) -> bool {
    let n = bytes.len().min(ANSWER_MAGIC.len());
    bytes[..n] == ANSWER_MAGIC[..n]
}

fn ring_field(v: u32) -> Result<u32, HelloError> {
    if v.is_power_of_two() && (MIN_RING_BYTES..=MAX_RING_BYTES).contains(&v) {
        Ok(v)
    } else {
        Err(HelloError::Field {
            field: "ring_bytes",
            value: u64::from(v),
        })
    }
}

/// The start of a record: magic, version, and nothing but zeros in
/// `zeros`.
fn head(magic: &[u8; 8], code: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(ANSWER_BYTES);
    b.extend_from_slice(magic);
    b.extend_from_slice(&PRELOAD_VERSION.to_le_bytes());
    b.extend_from_slice(&code.to_le_bytes());
    b
}

/// The first `want` bytes of `bytes`, if they are a record with `magic`
/// of this version.
fn record<'a>(bytes: &'a [u8], want: usize, magic: &[u8; 8]) -> Result<&'a [u8], HelloError> {
    let b = bytes.get(..want).ok_or(HelloError::Short {
        got_bytes: bytes.len(),
        want_bytes: want,
    })?;
    check_head(b, magic)?;
    Ok(b)
}

fn zeros(b: &[u8], field: &'static str) -> Result<(), HelloError> {
    if b.iter().all(|&x| x == 0) {
        Ok(())
    } else {
        Err(HelloError::Field { field, value: 1 })
    }
}

impl Hello {
    /// The hello's bytes: magic, version (u16), kind (u16: 0 shm, 1 xdp
    /// via relay), ring bytes (u32), then for a same-host hello the
    /// region's descriptor number (u32) and four zero bytes
    /// ([`SHM_HELLO_BYTES`] in all), for a relay hello four zero bytes and
    /// the connection key (32 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, ring, word) = match self {
            Hello::Shm {
                ring_bytes,
                region_fd,
            } => (KIND_SHM, *ring_bytes, *region_fd),
            Hello::Relay { ring_bytes, .. } => (KIND_RELAY, *ring_bytes, 0),
        };
        let mut b = head(&HELLO_MAGIC, kind);
        b.extend_from_slice(&ring.to_le_bytes());
        b.extend_from_slice(&word.to_le_bytes());
        match self {
            Hello::Shm { .. } => b.extend_from_slice(&[0; 4]),
            Hello::Relay { key, .. } => b.extend_from_slice(key),
        }
        b
    }

    /// Decodes the hello at the start of `bytes` (its length from
    /// [`hello_bytes`]), checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Hello, HelloError> {
        let want = hello_bytes(bytes).unwrap_or(SHM_HELLO_BYTES);
        let b = record(bytes, want, &HELLO_MAGIC)?;
        let ring_bytes = ring_field(u32_at(b, 12))?;
        let word = u32_at(b, 16);
        match u16_at(b, 10) {
            KIND_SHM => {
                zeros(&b[20..24], "reserved")?;
                if word > i32::MAX.cast_unsigned() {
                    return Err(HelloError::Field {
                        field: "region_fd",
                        value: u64::from(word),
                    });
                }
                Ok(Hello::Shm {
                    ring_bytes,
                    region_fd: word,
                })
            }
            KIND_RELAY => {
                zeros(&b[16..20], "reserved")?;
                let mut key = [0u8; RELAY_KEY_BYTES];
                key.copy_from_slice(&b[20..52]);
                Ok(Hello::Relay { ring_bytes, key })
            }
            kind => Err(HelloError::Field {
                field: "kind",
                value: u64::from(kind),
            }),
        }
    }
}

impl Answer {
    /// The answer's bytes: magic, version (u16), code (u16: zero when
    /// accepted, 100 for a relay's target, else the refusal), the target's
    /// length (u16), two reserved zero bytes ([`SHORT_ANSWER_BYTES`] in
    /// all), then the target (64 bytes, zero padded) of an
    /// [`Answer::Relay`]. A target longer than [`MAX_TARGET_BYTES`] is cut
    /// (and then fails to decode): the caller checks it with
    /// [`valid_target`].
    pub fn encode(&self) -> Vec<u8> {
        let code = match self {
            Answer::Accepted => 0,
            Answer::Relay(_) => CODE_RELAY,
            Answer::Refused(r) => r.code(),
        };
        let mut b = head(&ANSWER_MAGIC, code);
        b.resize(SHORT_ANSWER_BYTES, 0);
        if let Answer::Relay(t) = self {
            let n = t.len().min(MAX_TARGET_BYTES);
            b[12..14].copy_from_slice(&(n as u16).to_le_bytes());
            b.extend_from_slice(&t.as_bytes()[..n]);
            b.resize(ANSWER_BYTES, 0);
        }
        b
    }

    /// Decodes the answer at the start of `bytes` (its length from
    /// [`answer_bytes`]).
    pub fn decode(bytes: &[u8]) -> Result<Answer, HelloError> {
        let want = answer_bytes(bytes).unwrap_or(SHORT_ANSWER_BYTES);
        let b = record(bytes, want, &ANSWER_MAGIC)?;
        let len = usize::from(u16_at(b, 12));
        let code = u16_at(b, 10);
        let target_ok = if code == CODE_RELAY {
            (1..=MAX_TARGET_BYTES).contains(&len)
        } else {
            len == 0
        };
        if !target_ok {
            return Err(HelloError::Field {
                field: "target_len",
                value: len as u64,
            });
        }
        zeros(&b[14..16], "reserved")?;
        Ok(match code {
            0 => Answer::Accepted,
            CODE_RELAY => {
                zeros(&b[16 + len..], "target_padding")?;
                let t = std::str::from_utf8(&b[16..16 + len])
                    .ok()
                    .filter(|t| valid_target(t))
                    .ok_or(HelloError::Field {
                        field: "target",
                        value: len as u64,
                    })?;
                Answer::Relay(t.to_string())
            }
            c => Answer::Refused(Refusal::from_code(c)),
        })
    }
}

/// Whether `t` can be an answer's xdp target: 1 to [`MAX_TARGET_BYTES`]
/// bytes of ASCII letters, digits and `.:/`.
pub fn valid_target(t: &str) -> bool {
    (1..=MAX_TARGET_BYTES).contains(&t.len())
        && t.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b':' | b'/'))
}

/// First eight bytes of a library's request to its host's relay.
pub const RELAY_REQUEST_MAGIC: [u8; 8] = *b"NGRELAY\0";
/// First eight bytes of a relay's reply.
pub const RELAY_REPLY_MAGIC: [u8; 8] = *b"NGRELAYR";
/// Bytes of a request to the relay (one datagram of its socket).
pub const RELAY_REQUEST_BYTES: usize = 128;
/// Bytes of a relay's reply.
pub const RELAY_REPLY_BYTES: usize = 80;

/// What a library asks its host's relay for one connection (the region's
/// memfd and the connection's TCP socket travel beside it, as
/// `SCM_RIGHTS`).
#[derive(Clone, PartialEq, Eq)]
pub enum RelayRequest {
    /// Listen for the connection's xdp flow and say where (the accepting
    /// side).
    Listen {
        /// Bytes of each ring of the region.
        ring_bytes: u32,
        /// The key from the connector's hello.
        key: [u8; RELAY_KEY_BYTES],
    },
    /// Hold the relay for a connection about to be offered (the
    /// connecting side, before its hello): refused at once when the relay
    /// is busy, so the connection can still stay on the kernel's TCP.
    Reserve {
        /// Bytes of each ring of the region.
        ring_bytes: u32,
        /// The key this side drew for its hello.
        key: [u8; RELAY_KEY_BYTES],
    },
    /// Open the connection's xdp flow to `target` (the connecting side).
    Connect {
        /// Bytes of each ring of the region.
        ring_bytes: u32,
        /// The key this side drew and sent in its hello.
        key: [u8; RELAY_KEY_BYTES],
        /// The listener relay's target, from the answer.
        target: String,
    },
}

impl std::fmt::Debug for RelayRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RelayRequest::Listen { ring_bytes, .. } => {
                write!(f, "Listen {{ ring_bytes: {ring_bytes} }}")
            }
            RelayRequest::Reserve { ring_bytes, .. } => {
                write!(f, "Reserve {{ ring_bytes: {ring_bytes} }}")
            }
            RelayRequest::Connect {
                ring_bytes, target, ..
            } => write!(
                f,
                "Connect {{ ring_bytes: {ring_bytes}, target: {target} }}"
            ),
        }
    }
}

/// A relay's reply: the target it listens at (or `-` after a connect),
/// or why it refused (printable ASCII, at most [`MAX_TARGET_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayReply {
    /// Done: the target a listen made, `-` for a connect.
    Ok(String),
    /// Refused, with the reason.
    Refused(String),
}

/// Printable ASCII of `s`, cut to [`MAX_TARGET_BYTES`] (the rest of a
/// reason is lost, never the framing).
fn printable(s: &str) -> Vec<u8> {
    s.bytes()
        .map(|c| if (0x20..0x7f).contains(&c) { c } else { b'?' })
        .take(MAX_TARGET_BYTES)
        .collect()
}

fn text_at(b: &[u8], len_at: usize, text_at: usize) -> Result<String, HelloError> {
    let len = usize::from(u16_at(b, len_at));
    let field = HelloError::Field {
        field: "text",
        value: len as u64,
    };
    if len > MAX_TARGET_BYTES {
        return Err(field);
    }
    let t = &b[text_at..text_at + len];
    if t.iter().any(|c| !(0x20..0x7f).contains(c))
        || b[text_at + len..text_at + MAX_TARGET_BYTES]
            .iter()
            .any(|&x| x != 0)
    {
        return Err(field);
    }
    Ok(String::from_utf8_lossy(t).into_owned())
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

impl RelayRequest {
    /// The request's bytes: magic, version (u16), operation (u16: 1
    /// listen, 2 connect, 3 reserve), ring bytes (u32), key (32 bytes), the target's
    /// length (u16), two zero bytes, the target (64 bytes, zero padded),
    /// zeros to 128.
    pub fn encode(&self) -> [u8; RELAY_REQUEST_BYTES] {
        let mut b = [0u8; RELAY_REQUEST_BYTES];
        b[..8].copy_from_slice(&RELAY_REQUEST_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        let (op, ring, key, target) = match self {
            RelayRequest::Listen { ring_bytes, key } => (1u16, *ring_bytes, key, ""),
            RelayRequest::Reserve { ring_bytes, key } => (3u16, *ring_bytes, key, ""),
            RelayRequest::Connect {
                ring_bytes,
                key,
                target,
            } => (2u16, *ring_bytes, key, target.as_str()),
        };
        b[10..12].copy_from_slice(&op.to_le_bytes());
        b[12..16].copy_from_slice(&ring.to_le_bytes());
        b[16..48].copy_from_slice(key);
        let t = printable(target);
        b[48..50].copy_from_slice(&(t.len() as u16).to_le_bytes());
        b[52..52 + t.len()].copy_from_slice(&t);
        b
    }

    /// Decodes a request of exactly [`RELAY_REQUEST_BYTES`], checking
    /// every field.
    pub fn decode(bytes: &[u8]) -> Result<RelayRequest, HelloError> {
        if bytes.len() != RELAY_REQUEST_BYTES {
            return Err(HelloError::Short {
                got_bytes: bytes.len(),
                want_bytes: RELAY_REQUEST_BYTES,
            });
        }
        let b = bytes;
        check_head(b, &RELAY_REQUEST_MAGIC)?;
        let ring_bytes = u32_at(b, 12);
        if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(HelloError::Field {
                field: "ring_bytes",
                value: u64::from(ring_bytes),
            });
        }
        let mut key = [0u8; RELAY_KEY_BYTES];
        key.copy_from_slice(&b[16..48]);
        if b[50..52] != [0, 0] || b[116..].iter().any(|&x| x != 0) {
            return Err(HelloError::Field {
                field: "reserved",
                value: 1,
            });
        }
        let target = text_at(b, 48, 52)?;
        match u16_at(b, 10) {
            1 if target.is_empty() => Ok(RelayRequest::Listen { ring_bytes, key }),
            3 if target.is_empty() => Ok(RelayRequest::Reserve { ring_bytes, key }),
            2 if valid_target(&target) => Ok(RelayRequest::Connect {
                ring_bytes,
                key,
                target,
            }),
            op => Err(HelloError::Field {
                field: "op",
                value: u64::from(op),
            }),
        }
    }
}

impl RelayReply {
    /// The reply's bytes: magic, version (u16), code (u16: 0 done, 1
    /// refused), the text's length (u16), two zero bytes, the text (64
    /// bytes, zero padded).
    pub fn encode(&self) -> [u8; RELAY_REPLY_BYTES] {
        let mut b = [0u8; RELAY_REPLY_BYTES];
        b[..8].copy_from_slice(&RELAY_REPLY_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        let (code, text) = match self {
            RelayReply::Ok(t) => (0u16, t),
            RelayReply::Refused(t) => (1u16, t),
        };
        b[10..12].copy_from_slice(&code.to_le_bytes());
        let t = printable(text);
        b[12..14].copy_from_slice(&(t.len() as u16).to_le_bytes());
        b[16..16 + t.len()].copy_from_slice(&t);
        b
    }

    /// Decodes a reply of exactly [`RELAY_REPLY_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<RelayReply, HelloError> {
        if bytes.len() != RELAY_REPLY_BYTES {
            return Err(HelloError::Short {
                got_bytes: bytes.len(),
                want_bytes: RELAY_REPLY_BYTES,
            });
        }
        check_head(bytes, &RELAY_REPLY_MAGIC)?;
        let text = text_at(bytes, 12, 16)?;
        match u16_at(bytes, 10) {
            0 => Ok(RelayReply::Ok(text)),
            1 => Ok(RelayReply::Refused(text)),
            c => Err(HelloError::Field {
                field: "code",
                value: u64::from(c),
            }),
        }
    }
}

/// The UDP port a relay answers probes on: whether a program under the
/// library listens on a TCP port of its host.
pub const PROBE_PORT: u16 = 7472;
/// Magic of a probe.
pub const PROBE_MAGIC: [u8; 8] = *b"NGPROBE\0";
/// Magic of a probe's answer.
pub const PROBE_ANSWER_MAGIC: [u8; 8] = *b"NGPROBEA";
/// Bytes of a probe and of its answer (the same: an answer is never
/// larger than what asked for it).
pub const PROBE_BYTES: usize = 24;

/// A connector's question to the relay of another host, before it sends a
/// relay hello on a new connection (which a program without the library
/// would read as its own data): does a program under the library listen
/// on TCP port `port` of IP version `family` there?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// 4 or 6.
    pub family: u8,
    /// The TCP port.
    pub port: u16,
    /// Random bytes the answer repeats (a stray or forged answer to
    /// another probe is not taken).
    pub nonce: [u8; 8],
}

/// The relay's answer to a [`Probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The probe's port.
    pub port: u16,
    /// Whether a program under the library listens on it.
    pub listening: bool,
    /// The probe's nonce.
    pub nonce: [u8; 8],
}

/// A probe record's bytes: magic, version (u16), one byte of its own,
/// zero, port (u16), two zero bytes, nonce (8 bytes).
fn probe_record(magic: &[u8; 8], byte: u8, port: u16, nonce: &[u8; 8]) -> [u8; PROBE_BYTES] {
    let mut b = [0u8; PROBE_BYTES];
    b[..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
    b[10] = byte;
    b[12..14].copy_from_slice(&port.to_le_bytes());
    b[16..24].copy_from_slice(nonce);
    b
}

/// The fields of a probe record of exactly [`PROBE_BYTES`] with `magic`:
/// its own byte, the port, the nonce.
fn parse_probe_record(bytes: &[u8], magic: &[u8; 8]) -> Result<(u8, u16, [u8; 8]), HelloError> {
    if bytes.len() != PROBE_BYTES {
        return Err(HelloError::Short {
            got_bytes: bytes.len(),
            want_bytes: PROBE_BYTES,
        });
    }
    check_head(bytes, magic)?;
    if bytes[11] != 0 || bytes[14..16] != [0, 0] {
        return Err(HelloError::Field {
            field: "padding",
            value: 1,
        });
    }
    let mut nonce = [0u8; 8];
    nonce.copy_from_slice(&bytes[16..24]);
    Ok((bytes[10], u16_at(bytes, 12), nonce))
}

impl Probe {
    /// The probe's bytes (its own byte: the family).
    pub fn encode(&self) -> [u8; PROBE_BYTES] {
        probe_record(&PROBE_MAGIC, self.family, self.port, &self.nonce)
    }

    /// Decodes a probe of exactly [`PROBE_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<Probe, HelloError> {
        let (family, port, nonce) = parse_probe_record(bytes, &PROBE_MAGIC)?;
        if family != 4 && family != 6 {
            return Err(HelloError::Field {
                field: "family",
                value: u64::from(family),
            });
        }
        if port == 0 {
            return Err(HelloError::Field {
                field: "port",
                value: 0,
            });
        }
        Ok(Probe {
            family,
            port,
            nonce,
        })
    }
}

impl ProbeAnswer {
    /// The answer's bytes (its own byte: listening, 0 or 1).
    pub fn encode(&self) -> [u8; PROBE_BYTES] {
        probe_record(
            &PROBE_ANSWER_MAGIC,
            u8::from(self.listening),
            self.port,
            &self.nonce,
        )
    }

    /// Decodes an answer of exactly [`PROBE_BYTES`].
    pub fn decode(bytes: &[u8]) -> Result<ProbeAnswer, HelloError> {
        let (listening, port, nonce) = parse_probe_record(bytes, &PROBE_ANSWER_MAGIC)?;
        let listening = match listening {
            0 => false,
            1 => true,
            v => {
                return Err(HelloError::Field {
                    field: "listening",
                    value: u64::from(v),
                })
            }
        };
        Ok(ProbeAnswer {
            port,
            listening,
            nonce,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_probe_and_its_answer_round_trip_and_bad_ones_are_refused() {
        let p = Probe {
            family: 4,
            port: 8080,
            nonce: [9; 8],
        };
        assert_eq!(Probe::decode(&p.encode()).unwrap(), p);
        let a = ProbeAnswer {
            port: 8080,
            listening: true,
            nonce: [9; 8],
        };
        assert_eq!(ProbeAnswer::decode(&a.encode()).unwrap(), a);
        // An answer is not a probe, nor the reverse.
        assert_eq!(Probe::decode(&a.encode()), Err(HelloError::Magic));
        assert_eq!(ProbeAnswer::decode(&p.encode()), Err(HelloError::Magic));
        let mut b = p.encode();
        b[10] = 5;
        assert!(Probe::decode(&b).is_err());
        let mut b = p.encode();
        b[12..14].copy_from_slice(&0u16.to_le_bytes());
        assert!(Probe::decode(&b).is_err());
        assert!(Probe::decode(&p.encode()[..PROBE_BYTES - 1]).is_err());
        let mut b = a.encode();
        b[10] = 2;
        assert!(ProbeAnswer::decode(&b).is_err());
    }

    #[test]
    fn a_hello_and_an_answer_round_trip() {
        let h = Hello::Shm {
            ring_bytes: 1 << 18,
            region_fd: 7,
        };
        assert_eq!(h.encode().len(), SHM_HELLO_BYTES);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let r = Hello::Relay {
            ring_bytes: 1 << 18,
            key: [7u8; RELAY_KEY_BYTES],
        };
        assert_eq!(r.encode().len(), HELLO_BYTES);
        assert_eq!(Hello::decode(&r.encode()).unwrap(), r);
        assert!(
            !format!("{r:?}").contains("7, 7"),
            "the key stays out of logs"
        );
        for a in [
            Answer::Accepted,
            Answer::Relay("10.0.1.2/02:00:00:00:01:02/4242".into()),
            Answer::Refused(Refusal::NoRelay),
            Answer::Refused(Refusal::BadRegion),
            Answer::Refused(Refusal::OtherUser),
            Answer::Refused(Refusal::Other(99)),
        ] {
            let wire = a.encode();
            assert_eq!(answer_bytes(&wire), Some(wire.len()));
            assert_eq!(Answer::decode(&wire).unwrap(), a);
        }
    }

    #[test]
    fn bad_records_are_refused_by_field() {
        let good = Hello::Shm {
            ring_bytes: 4096,
            region_fd: 3,
        }
        .encode();
        assert_eq!(good.len(), SHM_HELLO_BYTES);
        assert!(matches!(
            Hello::decode(&good[..10]),
            Err(HelloError::Short { .. })
        ));
        assert_eq!(
            Hello::decode(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(HelloError::Magic)
        );
        let mut b = good.clone();
        b[8] = 9;
        assert_eq!(Hello::decode(&b), Err(HelloError::Version(9)));
        let mut b = good.clone();
        b[12..16].copy_from_slice(&5000u32.to_le_bytes());
        assert!(matches!(
            Hello::decode(&b),
            Err(HelloError::Field {
                field: "ring_bytes",
                ..
            })
        ));
        let mut b = good.clone();
        b[10] = 7;
        assert!(matches!(
            Hello::decode(&b),
            Err(HelloError::Field { field: "kind", .. })
        ));
        // A relay hello cut at the same-host length is short.
        assert_eq!(hello_bytes(&good[..11]), None);
        let mut b = good.clone();
        b[10] = 1;
        assert_eq!(hello_bytes(&b), Some(HELLO_BYTES));
        assert!(matches!(Hello::decode(&b), Err(HelloError::Short { .. })));
        // An answer whose target is not printable or too long, or whose
        // padding is not zero.
        let mut a = Answer::Relay("10.0.0.1/x/1".into()).encode();
        a[17] = b' ';
        assert!(Answer::decode(&a).is_err());
        let mut a = Answer::Relay("1".into()).encode();
        a[12] = 65;
        assert!(Answer::decode(&a).is_err());
        let mut a = Answer::Relay("1".into()).encode();
        a[40] = 1;
        assert!(Answer::decode(&a).is_err());
        let mut a = Answer::Accepted.encode();
        a[12] = 1;
        assert!(Answer::decode(&a).is_err());
        let mut b = good.clone();
        b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Hello::decode(&b),
            Err(HelloError::Field {
                field: "region_fd",
                ..
            })
        ));
        let mut b = good.clone();
        b[23] = 1;
        assert!(Hello::decode(&b).is_err());
        let req = RelayRequest::Connect {
            ring_bytes: 4096,
            key: [3; RELAY_KEY_BYTES],
            target: "10.0.0.1/02:00:00:00:00:01/7".into(),
        };
        assert_eq!(RelayRequest::decode(&req.encode()).unwrap(), req);
        let mut bad = req.encode();
        bad[10] = 1;
        assert!(
            RelayRequest::decode(&bad).is_err(),
            "a listen names no target"
        );
        assert!(RelayRequest::decode(&req.encode()[..100]).is_err());
        let r = RelayReply::Refused("busy: \u{e9}".into());
        assert_eq!(
            RelayReply::decode(&r.encode()).unwrap(),
            RelayReply::Refused("busy: ??".into())
        );
        assert!(could_be_hello(b"NGPR"));
        assert!(!could_be_hello(b"GET "));
        assert!(could_be_answer(&Answer::Accepted.encode()[..3]));
    }

    #[test]
    fn names_fit_a_unix_socket_address() {
        assert_eq!(beacon_name(0, 4, 8080), "netgap-preload.0.4.8080");
        assert_eq!(mailbox_name(0x1234), "netgap-preload.m.1234");
        // sun_path holds 108 bytes: a NUL, the name.
        assert!(mailbox_name(u64::MAX).len() < 107);
        assert!(beacon_name(u32::MAX, 6, u16::MAX).len() < 107);
    }
}
