//! Framing of control messages: a 4-byte big-endian payload length, then
//! that many bytes of UTF-8 JSON holding one [`Request`] or [`Reply`].
//!
//! This layer works on byte slices and `Vec<u8>` only: it does no I/O. The
//! socket edge (agent, coordinator) reads bytes, [`FrameDecoder::push`]es
//! them, and asks [`FrameDecoder::needed`] how many more to read so it never
//! reads past the end of a frame. Every length is checked from the 4 header
//! bytes alone, before anything is allocated for the payload, and every
//! decoded message is range-checked, so a hostile or broken peer can cost at
//! most one [`MAX_FRAME_BYTES`] buffer and never causes a panic.

use super::message::{Reply, Request};
use netgap_core::spec::RangeError;
use serde::Serialize;

/// Largest payload of one control frame, in bytes (header excluded).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// Length of the frame header, in bytes: the payload length as a big-endian
/// `u32`.
pub const HEADER_BYTES: usize = 4;

/// Most bytes a [`FrameDecoder`] ever holds: one largest frame with its
/// header.
pub const MAX_BUFFERED_BYTES: usize = MAX_FRAME_BYTES + HEADER_BYTES;

/// Longest serde error text kept in [`CodecError::Malformed`], in bytes.
const MAX_ERROR_TEXT_BYTES: usize = 256;

/// Why a control frame could not be encoded or decoded. Once a decoder has
/// returned an error the byte stream cannot be resynchronized: the caller
/// reports the error and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A frame header (or an encoded message) announces more than
    /// [`MAX_FRAME_BYTES`] of payload.
    #[error("control frame of {len_bytes} bytes exceeds the {max_bytes}-byte limit")]
    FrameTooLarge {
        /// Announced (or encoded) payload length, in bytes.
        len_bytes: usize,
        /// The limit, [`MAX_FRAME_BYTES`].
        max_bytes: usize,
    },
    /// A frame header announces a payload of 0 bytes.
    #[error("control frame of 0 bytes: every frame must carry a message")]
    EmptyFrame,
    /// More bytes were pushed into a [`FrameDecoder`] than it may hold
    /// without a complete frame being taken out; the excess was dropped.
    #[error(
        "control stream overrun: more than {max_bytes} bytes were buffered without a complete frame being taken out"
    )]
    Overrun {
        /// The limit, [`MAX_BUFFERED_BYTES`].
        max_bytes: usize,
    },
    /// The payload is not the JSON of a known message (bad UTF-8 or JSON,
    /// unknown message kind or field, missing field, wrong type). Holds the
    /// parser's message, on one line and truncated.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// The message parsed but a field is out of range.
    #[error("invalid control message: {0}")]
    OutOfRange(#[from] RangeError),
    /// The message could not be serialized (a bug on this side).
    #[error("could not encode control message: {0}")]
    Encode(String),
}

/// Checks a payload length read from a header or produced by the encoder.
fn check_len(len_bytes: usize) -> Result<(), CodecError> {
    if len_bytes == 0 {
        return Err(CodecError::EmptyFrame);
    }
    if len_bytes > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge {
            len_bytes,
            max_bytes: MAX_FRAME_BYTES,
        });
    }
    Ok(())
}

/// Encodes `msg` (a [`Request`] or [`Reply`]) as one frame: header then JSON
/// payload. Fails with [`CodecError::FrameTooLarge`] if the JSON exceeds
/// [`MAX_FRAME_BYTES`]; never panics.
pub fn encode<M: Serialize>(msg: &M) -> Result<Vec<u8>, CodecError> {
    let payload = serde_json::to_vec(msg)
        .map_err(|e| CodecError::Encode(one_line(&e.to_string(), MAX_ERROR_TEXT_BYTES)))?;
    check_len(payload.len())?;
    let header = u32::try_from(payload.len()).map_err(|_| CodecError::FrameTooLarge {
        len_bytes: payload.len(),
        max_bytes: MAX_FRAME_BYTES,
    })?;
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(&header.to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Parses and range-checks the payload of a frame sent by a coordinator.
/// Unknown message kinds and fields are rejected ([`CodecError::Malformed`]),
/// out-of-range values too ([`CodecError::OutOfRange`]); never panics on peer
/// input.
pub fn decode_request(payload: &[u8]) -> Result<Request, CodecError> {
    let req: Request = parse(payload)?;
    req.validate()?;
    Ok(req)
}

/// Parses and range-checks the payload of a frame sent by an agent, with the
/// same strictness as [`decode_request`]; never panics on peer input.
pub fn decode_reply(payload: &[u8]) -> Result<Reply, CodecError> {
    let reply: Reply = parse(payload)?;
    reply.validate()?;
    Ok(reply)
}

fn parse<'a, T: serde::Deserialize<'a>>(payload: &'a [u8]) -> Result<T, CodecError> {
    serde_json::from_slice(payload)
        .map_err(|e| CodecError::Malformed(one_line(&e.to_string(), MAX_ERROR_TEXT_BYTES)))
}

/// Makes text that may come from a peer safe to show on one line: control
/// characters are escaped (`\n`, `\u{1b}`, ...) and the result is cut to at
/// most `max_bytes` bytes, ending in `…` when cut. Never panics.
pub(crate) fn one_line(text: &str, max_bytes: usize) -> String {
    const ELLIPSIS: char = '…';
    let mut out = String::with_capacity(text.len().min(max_bytes));
    for c in text.chars() {
        let width = if c.is_control() {
            c.escape_default().len()
        } else {
            c.len_utf8()
        };
        if out.len() + width > max_bytes {
            // Cut: make room for the ellipsis.
            while out.len() + ELLIPSIS.len_utf8() > max_bytes {
                if out.pop().is_none() {
                    return out;
                }
            }
            out.push(ELLIPSIS);
            return out;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Incremental frame decoder: bytes go in as they arrive, complete payloads
/// come out in order.
///
/// Memory is bounded: the decoder never holds more than
/// [`MAX_BUFFERED_BYTES`] (one largest frame and its header). Bytes pushed
/// beyond that are dropped and the stream is marked overrun: the frames
/// complete before the cut still come out, then [`FrameDecoder::next_frame`]
/// returns [`CodecError::Overrun`]. Once the header at the front announces an
/// invalid length (0 or over [`MAX_FRAME_BYTES`]) every further pushed byte is
/// dropped, since nothing after it can be framed. A caller that reads exactly
/// [`FrameDecoder::needed`] bytes at a time never overruns.
///
/// After an error every later call to `next_frame` returns an error again.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    /// Received bytes not yet taken out; starts at a frame header.
    buf: Vec<u8>,
    /// Bytes were dropped for lack of room: the stream is cut.
    overrun: bool,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Payload length announced by the header at the front, if it is complete.
    fn front_len(&self) -> Option<usize> {
        let header = self.buf.first_chunk::<HEADER_BYTES>()?;
        Some(usize::try_from(u32::from_be_bytes(*header)).unwrap_or(usize::MAX))
    }

    /// Whether the header at the front is complete and announces an invalid
    /// length.
    fn front_invalid(&self) -> bool {
        self.front_len().is_some_and(|len| check_len(len).is_err())
    }

    /// Appends received bytes (any number, possibly spanning several frames
    /// or splitting a header). Never panics and never lets the buffer grow
    /// past [`MAX_BUFFERED_BYTES`]: see the type's documentation for what
    /// happens to bytes that do not fit.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.overrun || self.front_invalid() {
            return;
        }
        let mut rest = bytes;
        // Complete the front header first, so an invalid length is caught
        // before any payload byte is stored.
        if self.buf.len() < HEADER_BYTES {
            let take = (HEADER_BYTES - self.buf.len()).min(rest.len());
            let (head, tail) = rest.split_at(take);
            self.buf.extend_from_slice(head);
            rest = tail;
            if self.front_invalid() {
                return;
            }
        }
        let room = MAX_BUFFERED_BYTES.saturating_sub(self.buf.len());
        let take = room.min(rest.len());
        let (kept, dropped) = rest.split_at(take);
        self.buf.extend_from_slice(kept);
        if !dropped.is_empty() {
            self.overrun = true;
        }
    }

    /// Takes out the next complete payload. `Ok(None)` means more bytes are
    /// needed (truncated input is not an error); `Err` means the stream is
    /// broken: an invalid length in a header ([`CodecError::EmptyFrame`],
    /// [`CodecError::FrameTooLarge`], detected from the 4 header bytes alone)
    /// or an overrun. The payload is not parsed: pass it to
    /// [`decode_request`] or [`decode_reply`].
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        if let Some(len) = self.front_len() {
            check_len(len)?;
            let end = HEADER_BYTES + len;
            if let Some(payload) = self.buf.get(HEADER_BYTES..end) {
                let payload = payload.to_vec();
                self.buf.drain(..end);
                return Ok(Some(payload));
            }
        }
        if self.overrun {
            return Err(CodecError::Overrun {
                max_bytes: MAX_BUFFERED_BYTES,
            });
        }
        Ok(None)
    }

    /// Bytes held, in bytes: at most [`MAX_BUFFERED_BYTES`].
    pub fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    /// How many more bytes complete the frame at the front, in bytes: at
    /// least 1 while [`FrameDecoder::next_frame`] would return `Ok(None)`,
    /// and 0 exactly when it would return a frame or an error. Before the
    /// header is complete this counts only the missing header bytes, so a
    /// caller reading exactly this many bytes never reads past a frame.
    pub fn needed(&self) -> usize {
        match self.front_len() {
            None if self.overrun => 0,
            None => HEADER_BYTES - self.buf.len(),
            Some(len) if check_len(len).is_err() || self.overrun => 0,
            Some(len) => (HEADER_BYTES + len).saturating_sub(self.buf.len()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::dataproof::test_token;
    use crate::message::{Phase, PROTOCOL_VERSION};
    use netgap_core::cpu::CpuUsage;
    use netgap_core::datagram::DatagramStats;
    use netgap_core::host::HostFacts;
    use netgap_core::spec::{Mode, PointSpec, TransportOptions};
    use proptest::prelude::*;

    fn spec() -> PointSpec {
        PointSpec {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: Mode::Poll,
            size_bytes: 64,
            options: TransportOptions {
                nodelay: false,
                sndbuf_bytes: Some(1 << 20),
                rcvbuf_bytes: None,
                congestion: Some("cubic".into()),
                ..TransportOptions::default()
            },
            server_cpu: Some(3),
            io_timeout_ms: 5000,
            verify: false,
        }
    }

    fn host() -> HostFacts {
        HostFacts {
            hostname: "agent-1".into(),
            kernel: "6.8.0".into(),
            cpu_model: "Test CPU".into(),
            cores: 8,
            interface: Some("eth0".into()),
            mtu_bytes: Some(1500),
            sysctls: [("net.core.rmem_max".to_string(), "212992".to_string())]
                .into_iter()
                .collect(),
            netgap_version: "0.1.0".into(),
            offloads: None,
            qdisc: None,
        }
    }

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Hello {
                protocol: PROTOCOL_VERSION,
                version: "0.1.0".into(),
            },
            Request::Open {
                spec: spec(),
                data_token: test_token(),
            },
            Request::Run {
                iterations: 1000,
                phase: Phase::Warmup,
            },
            Request::Run {
                iterations: 1,
                phase: Phase::Measure,
            },
            Request::Close,
            Request::Bye,
            Request::WorkloadPrepare {
                spec: crate::workload::sample_spec(crate::workload::WorkloadRole::Client),
                data_token: test_token(),
            },
            Request::WorkloadPrepare {
                // A workload's programs kept on the relays.
                spec: {
                    let mut s = crate::workload::sample_spec(crate::workload::WorkloadRole::Server);
                    s.point.transport = "xdp".into();
                    s.point.options.preload_relayed = true;
                    s
                },
                data_token: test_token(),
            },
            Request::WorkloadGo,
            Request::ClientOpen {
                spec: spec(),
                data_token: test_token(),
                target: "10.0.0.1:40000".into(),
                client_cpu: None,
            },
            Request::ClientOpen {
                spec: spec(),
                data_token: test_token(),
                target: "10.0.0.1:40001".into(),
                client_cpu: Some(2),
            },
            Request::ClientRun {
                iterations: 500,
                phase: Phase::Measure,
            },
        ]
    }

    fn all_replies() -> Vec<Reply> {
        vec![
            Reply::Welcome {
                protocol: PROTOCOL_VERSION,
                version: "0.1.0".into(),
                host: host(),
            },
            Reply::VersionMismatch { supported: 7 },
            Reply::Busy,
            Reply::Listening {
                addr: "10.0.0.2:40000".into(),
            },
            Reply::Accepted,
            Reply::Done {
                bytes_rx: 1 << 40,
                bytes_tx: 12,
                cpu: CpuUsage {
                    system_busy_percent: 12.5,
                    process_percent: 99.25,
                    cpu_ns: 123_456_789,
                    wall_ns: 1_000_000_000,
                    softirq_percent: Some(3.5),
                },
                datagrams: None,
            },
            Reply::Done {
                bytes_rx: 0,
                bytes_tx: 1,
                cpu: CpuUsage::default(),
                datagrams: Some(DatagramStats {
                    datagrams_sent: 10,
                    datagrams_received: 8,
                    lost: 2,
                    lost_bytes: 2048,
                    reordered: 1,
                    duplicates: 0,
                    retries: 1,
                    dropped: 4,
                }),
            },
            Reply::Closed,
            Reply::Error {
                message: "unknown transport \"rdma\"".into(),
            },
            Reply::WorkloadListening {
                addrs: vec!["10.0.0.2:40000".into(), "10.0.0.2:40001".into()],
            },
            Reply::WorkloadReady,
            Reply::WorkloadAlive,
            Reply::WorkloadFlows {
                flows: vec![crate::workload::FlowReport {
                    index: 3,
                    bytes_tx: 10,
                    bytes_rx: 20,
                    window_bytes_rx: 15,
                    round_trips: 5,
                    percentiles: None,
                    errors: 0,
                }],
            },
            Reply::WorkloadBuckets {
                buckets: vec![[1000, 5], [2000, 1]],
            },
            Reply::WorkloadFinished {
                outcome: crate::workload::WorkloadOutcome {
                    window_ns: 1_000_000_000,
                    cpu: CpuUsage::default(),
                    peak_rss_kib: Some(12_000),
                    processes: None,
                    bytes_rx: 7,
                    bytes_tx: 8,
                    datagrams: Some(DatagramStats {
                        datagrams_sent: 3,
                        datagrams_received: 2,
                        duplicates: 1,
                        retries: 1,
                        ..DatagramStats::default()
                    }),
                    metrics: [("transactions".to_string(), 12.0)].into(),
                    services: Vec::new(),
                    last_error: None,
                    data_window_ns: None,
                    evidence: Vec::new(),
                },
            },
            Reply::ClientConnected {
                path_choices: vec!["zerocopy".into()],
            },
            Reply::ClientBuckets {
                buckets: vec![[1500, 3], [9000, 1]],
            },
            Reply::ClientDone {
                rep: crate::message::ClientRep {
                    elapsed_ns: 2_000_000,
                    value: 12.5,
                    bytes_tx: 4096,
                    bytes_rx: 4096,
                    cpu: CpuUsage::default(),
                    datagrams: None,
                },
            },
        ]
    }

    /// Frame with an arbitrary payload.
    fn raw_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(payload);
        f
    }

    fn one_frame(bytes: &[u8]) -> Vec<u8> {
        let mut d = FrameDecoder::new();
        d.push(bytes);
        let payload = d.next_frame().unwrap().unwrap();
        assert_eq!(d.buffered_len(), 0);
        payload
    }

    #[test]
    fn every_request_round_trips() {
        for req in all_requests() {
            let bytes = encode(&req).unwrap();
            assert_eq!(
                u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize,
                bytes.len() - 4
            );
            assert_eq!(decode_request(&one_frame(&bytes)).unwrap(), req);
        }
    }

    #[test]
    fn every_reply_round_trips() {
        for reply in all_replies() {
            let bytes = encode(&reply).unwrap();
            assert_eq!(decode_reply(&one_frame(&bytes)).unwrap(), reply);
        }
    }

    #[test]
    fn oversized_header_errors_before_payload() {
        let mut d = FrameDecoder::new();
        d.push(&((MAX_FRAME_BYTES + 1) as u32).to_be_bytes());
        assert_eq!(d.needed(), 0);
        assert_eq!(
            d.next_frame(),
            Err(CodecError::FrameTooLarge {
                len_bytes: MAX_FRAME_BYTES + 1,
                max_bytes: MAX_FRAME_BYTES
            })
        );
        // Nothing more is stored, and the error sticks.
        d.push(&[b'x'; 1000]);
        assert_eq!(d.buffered_len(), 4);
        assert!(d.next_frame().is_err());
        let msg = CodecError::FrameTooLarge {
            len_bytes: 1_048_576,
            max_bytes: MAX_FRAME_BYTES,
        }
        .to_string();
        assert_eq!(
            msg,
            "control frame of 1048576 bytes exceeds the 65536-byte limit"
        );
    }

    #[test]
    fn largest_frame_is_accepted() {
        let payload = vec![b' '; MAX_FRAME_BYTES];
        let mut d = FrameDecoder::new();
        d.push(&raw_frame(&payload));
        assert_eq!(d.buffered_len(), MAX_BUFFERED_BYTES);
        assert_eq!(d.next_frame().unwrap().unwrap().len(), MAX_FRAME_BYTES);
    }

    #[test]
    fn zero_length_frame_errors() {
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 0, b'{', b'}']);
        assert_eq!(d.next_frame(), Err(CodecError::EmptyFrame));
        assert_eq!(d.buffered_len(), 4);
    }

    #[test]
    fn byte_by_byte_push_decodes() {
        let req = Request::Open {
            spec: spec(),
            data_token: test_token(),
        };
        let bytes = encode(&req).unwrap();
        let mut d = FrameDecoder::new();
        for (i, b) in bytes.iter().enumerate() {
            // Only the header is asked for until it is complete.
            let expected = if i < HEADER_BYTES {
                HEADER_BYTES - i
            } else {
                bytes.len() - i
            };
            assert_eq!(d.needed(), expected);
            assert_eq!(d.next_frame().unwrap(), None);
            d.push(std::slice::from_ref(b));
        }
        assert_eq!(d.needed(), 0);
        let payload = d.next_frame().unwrap().unwrap();
        assert_eq!(decode_request(&payload).unwrap(), req);
        assert_eq!(d.buffered_len(), 0);
        assert_eq!(d.needed(), 4);
    }

    #[test]
    fn two_frames_in_one_push_decode_in_order() {
        let a = Request::Close;
        let b = Request::Run {
            iterations: 5,
            phase: Phase::Measure,
        };
        let mut bytes = encode(&a).unwrap();
        bytes.extend(encode(&b).unwrap());
        let mut d = FrameDecoder::new();
        d.push(&bytes);
        assert_eq!(
            decode_request(&d.next_frame().unwrap().unwrap()).unwrap(),
            a
        );
        assert_eq!(
            decode_request(&d.next_frame().unwrap().unwrap()).unwrap(),
            b
        );
        assert_eq!(d.next_frame().unwrap(), None);
    }

    #[test]
    fn truncated_input_is_none_until_complete() {
        let bytes = encode(&Reply::Accepted).unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes[..2]);
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.needed(), 2);
        d.push(&bytes[2..bytes.len() - 1]);
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.needed(), 1);
        d.push(&bytes[bytes.len() - 1..]);
        assert_eq!(
            decode_reply(&d.next_frame().unwrap().unwrap()).unwrap(),
            Reply::Accepted
        );
    }

    #[test]
    fn overrun_keeps_complete_frames_then_errors() {
        let small = encode(&Request::Bye).unwrap();
        let mut bytes = small.clone();
        bytes.extend(raw_frame(&vec![b' '; MAX_FRAME_BYTES]));
        let mut d = FrameDecoder::new();
        d.push(&bytes);
        assert_eq!(d.buffered_len(), MAX_BUFFERED_BYTES);
        // Dropped: the decoder does not grow and does not take more.
        d.push(&small);
        assert_eq!(d.buffered_len(), MAX_BUFFERED_BYTES);
        assert_eq!(
            decode_request(&d.next_frame().unwrap().unwrap()).unwrap(),
            Request::Bye
        );
        assert_eq!(d.needed(), 0);
        assert!(matches!(d.next_frame(), Err(CodecError::Overrun { .. })));
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn unknown_field_is_malformed() {
        let err = decode_request(br#"{"run":{"iterations":5,"phase":"measure","turbo":true}}"#)
            .unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed(m) if m.contains("turbo")),
            "{err}"
        );
        let err = decode_reply(br#"{"accepted":null,"x":1}"#).unwrap_err();
        assert!(matches!(err, CodecError::Malformed(_)), "{err}");
        let err = decode_reply(br#"{"teleported":{}}"#).unwrap_err();
        assert!(matches!(err, CodecError::Malformed(_)), "{err}");
    }

    #[test]
    fn out_of_range_iterations() {
        let bytes = encode(&Request::Run {
            iterations: 0,
            phase: Phase::Measure,
        })
        .unwrap();
        let err = decode_request(&one_frame(&bytes)).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "iterations"),
            "{err}"
        );
        assert!(err
            .to_string()
            .starts_with("invalid control message: iterations"));
    }

    #[test]
    fn out_of_range_reply_fields() {
        let long = Reply::Error {
            message: "x".repeat(crate::message::MAX_TEXT_BYTES + 1),
        };
        let err = decode_reply(&one_frame(&encode(&long).unwrap())).unwrap_err();
        assert!(matches!(err, CodecError::OutOfRange(_)), "{err}");
        // NaN is encoded as null by serde_json and refused on the way back in.
        let nan = Reply::Done {
            bytes_rx: 0,
            bytes_tx: 0,
            cpu: CpuUsage {
                system_busy_percent: f64::NAN,
                ..CpuUsage::default()
            },
            datagrams: None,
        };
        assert!(decode_reply(&one_frame(&encode(&nan).unwrap())).is_err());
        // Counters that cannot all be true are refused by name.
        let impossible = Reply::Done {
            bytes_rx: 0,
            bytes_tx: 0,
            cpu: CpuUsage::default(),
            datagrams: Some(DatagramStats {
                retries: 1,
                ..DatagramStats::default()
            }),
        };
        let err = decode_reply(&one_frame(&encode(&impossible).unwrap())).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "datagrams"),
            "{err}"
        );
    }

    /// The `messages` fuzz target's seeds stay messages of this protocol:
    /// each decodes as a request or a reply.
    #[test]
    fn the_fuzz_seeds_of_messages_decode() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/messages");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let request = decode_request(&bytes);
            assert!(
                request.is_ok() || decode_reply(&bytes).is_ok(),
                "{} decodes as no message: {request:?}",
                path.display()
            );
            seen += 1;
        }
        assert!(seen >= 14, "{seen} seeds");
    }

    #[test]
    fn out_of_range_client_role_messages() {
        let rep = crate::message::ClientRep {
            elapsed_ns: 1,
            value: f64::INFINITY,
            bytes_tx: 0,
            bytes_rx: 0,
            cpu: CpuUsage::default(),
            datagrams: None,
        };
        // Infinity is encoded as null and refused on the way back in; the
        // check itself refuses it before it is sent.
        assert!(decode_reply(&one_frame(&encode(&Reply::ClientDone { rep }).unwrap())).is_err());
        assert!(rep.validate().is_err());
        let many = Reply::ClientBuckets {
            buckets: vec![[1, 1]; crate::workload::BUCKETS_PER_CHUNK + 1],
        };
        let err = decode_reply(&one_frame(&encode(&many).unwrap())).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "buckets"),
            "{err}"
        );
        let choices = Reply::ClientConnected {
            path_choices: vec!["c".into(); crate::message::MAX_PATH_CHOICES + 1],
        };
        let err = decode_reply(&one_frame(&encode(&choices).unwrap())).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "path_choices"),
            "{err}"
        );
        let far = Request::ClientOpen {
            spec: spec(),
            data_token: test_token(),
            target: "x".repeat(crate::message::MAX_TEXT_BYTES + 1),
            client_cpu: None,
        };
        let err = decode_request(&one_frame(&encode(&far).unwrap())).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "target"),
            "{err}"
        );
        let far_cpu = Request::ClientOpen {
            spec: spec(),
            data_token: test_token(),
            target: "10.0.0.1:1".into(),
            client_cpu: Some(netgap_core::spec::MAX_CPU_INDEX + 1),
        };
        let err = decode_request(&one_frame(&encode(&far_cpu).unwrap())).unwrap_err();
        assert!(
            matches!(&err, CodecError::OutOfRange(r) if r.field == "client_cpu"),
            "{err}"
        );
        let none = Request::ClientRun {
            iterations: 0,
            phase: Phase::Measure,
        };
        assert!(decode_request(&one_frame(&encode(&none).unwrap())).is_err());
    }

    #[test]
    fn oversized_message_is_not_encoded() {
        let huge = Reply::Error {
            message: "y".repeat(MAX_FRAME_BYTES),
        };
        assert!(matches!(
            encode(&huge),
            Err(CodecError::FrameTooLarge { max_bytes, .. }) if max_bytes == MAX_FRAME_BYTES
        ));
    }

    #[test]
    fn malformed_messages_stay_on_one_short_line() {
        let payload = format!(r#"{{"run":{{"{}":1}}}}"#, "a\n".repeat(5000));
        let err = decode_request(payload.as_bytes()).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn one_line_escapes_and_cuts() {
        assert_eq!(one_line("a\nb", 100), "a\\nb");
        assert_eq!(one_line("abcdef", 4), "a…");
        assert_eq!(one_line("abc", 3), "abc");
        assert_eq!(one_line("abcd", 2), "");
        assert!(one_line(&"é".repeat(100), 11).len() <= 11);
    }

    /// The wire name of a message: its tag, a string for a unit variant or
    /// the one key of an object.
    fn wire_name(v: serde_json::Value) -> String {
        match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Object(m) => m.keys().next().cloned().unwrap_or_default(),
            other => panic!("not a message: {other}"),
        }
    }

    #[test]
    fn workload_messages_keep_their_protocol_names() {
        let mut names: Vec<String> = all_requests()
            .into_iter()
            .map(|m| wire_name(serde_json::to_value(m).unwrap()))
            .chain(
                all_replies()
                    .into_iter()
                    .map(|m| wire_name(serde_json::to_value(m).unwrap())),
            )
            .filter(|n| n.starts_with("group_") || n.starts_with("workload"))
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names,
            [
                "group_alive",
                "group_buckets",
                "group_finished",
                "group_flows",
                "group_go",
                "group_listening",
                "group_prepare",
                "group_ready",
            ]
        );
        // A frame recorded before the rename still decodes.
        assert_eq!(
            decode_request(br#""group_go""#).unwrap(),
            Request::WorkloadGo
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..2048),
            chunk in 1usize..64,
        ) {
            let mut d = FrameDecoder::new();
            for piece in bytes.chunks(chunk) {
                d.push(piece);
                prop_assert!(d.buffered_len() <= MAX_BUFFERED_BYTES);
                loop {
                    let needed = d.needed();
                    match d.next_frame() {
                        Ok(Some(payload)) => {
                            prop_assert_eq!(needed, 0);
                            let _ = decode_request(&payload);
                            let _ = decode_reply(&payload);
                        }
                        Ok(None) => {
                            prop_assert!(needed >= 1);
                            break;
                        }
                        Err(_) => {
                            prop_assert_eq!(needed, 0);
                            break;
                        }
                    }
                }
            }
        }

        #[test]
        fn random_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_request(&payload);
            let _ = decode_reply(&payload);
        }

        #[test]
        fn jsonish_payloads_never_panic(payload in r#"[{}\[\]":,0-9a-z_ .\-e]{0,200}"#) {
            let _ = decode_request(payload.as_bytes());
            let _ = decode_reply(payload.as_bytes());
        }

        #[test]
        fn any_oversized_header_errors(len in (MAX_FRAME_BYTES as u32 + 1)..=u32::MAX) {
            let mut d = FrameDecoder::new();
            d.push(&len.to_be_bytes());
            d.push(&[0u8; 64]);
            prop_assert_eq!(d.buffered_len(), 4);
            prop_assert_eq!(d.needed(), 0);
            let is_too_large = matches!(
                d.next_frame(),
                Err(CodecError::FrameTooLarge { len_bytes, .. }) if len_bytes == len as usize
            );
            prop_assert!(is_too_large);
        }

        #[test]
        fn frames_split_anywhere_decode(
            cut_a in 0usize..400,
            cut_b in 0usize..400,
            iterations in 1u64..=netgap_core::spec::MAX_ITERATIONS,
        ) {
            let msgs = [
                Request::Open { spec: spec(), data_token: test_token() },
                Request::Run { iterations, phase: Phase::Measure },
                Request::Close,
            ];
            let mut bytes = Vec::new();
            for m in &msgs {
                bytes.extend(encode(m).unwrap());
            }
            let a = cut_a.min(bytes.len());
            let b = cut_b.min(bytes.len()).max(a);
            let mut d = FrameDecoder::new();
            let mut out = Vec::new();
            for piece in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                d.push(piece);
                while let Some(payload) = d.next_frame().unwrap() {
                    out.push(decode_request(&payload).unwrap());
                }
            }
            prop_assert_eq!(out, msgs.to_vec());
            prop_assert_eq!(d.buffered_len(), 0);
        }
    }
}
