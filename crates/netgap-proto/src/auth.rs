//! The shared-key handshake that opens a control session with a keyed agent,
//! with no I/O: fixed-size frames, their strict parser, and the two state
//! machines that prove the key both ways.
//!
//! The exchange, each message one control frame (see [`super::codec`]):
//!
//! 1. coordinator → agent: `Begin` (says "I hold a key"; a keyless agent
//!    answers it with a one-line error instead of waiting for a `Hello`),
//! 2. agent → coordinator: `Challenge` with a fresh 32-byte agent nonce,
//! 3. coordinator → agent: `Response` with a fresh coordinator nonce and
//!    HMAC-SHA256(key, [`COORDINATOR_CONTEXT`] ‖ agent nonce ‖ coordinator nonce),
//! 4. agent → coordinator: `Proof`, HMAC-SHA256(key, [`AGENT_CONTEXT`] ‖ agent
//!    nonce ‖ coordinator nonce), so the coordinator knows the agent holds the
//!    key too.
//!
//! Only after step 3 checks out does the agent decode any [`super::Request`].
//! Tags are compared in constant time. A recorded `Response` is useless later:
//! it answers one agent nonce, and every session draws a new one.
//!
//! Auth frames start with a NUL byte, which no JSON message does, so either
//! end can tell an auth frame from a protocol message and say clearly that
//! the other end runs with or without a key.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of an HMAC-SHA256 tag.
pub(crate) const TAG_BYTES: usize = 32;
/// Fewest bytes a key may have (128 bits of entropy, if random).
pub const MIN_KEY_BYTES: usize = 16;
/// Most bytes a key may have.
pub const MAX_KEY_BYTES: usize = 4096;
/// Domain separation of the coordinator's tag.
pub const COORDINATOR_CONTEXT: &[u8] = b"netgap auth v1: coordinator";
/// Domain separation of the agent's tag.
pub const AGENT_CONTEXT: &[u8] = b"netgap auth v1: agent";

/// First bytes of every auth frame.
const MAGIC: &[u8; 4] = b"\0NGA";
const KIND_BEGIN: u8 = 1;
const KIND_CHALLENGE: u8 = 2;
const KIND_RESPONSE: u8 = 3;
const KIND_PROOF: u8 = 4;
const HEAD_BYTES: usize = MAGIC.len() + 1;

/// A shared key. Its bytes never appear in `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

impl Key {
    /// A key from raw bytes: [`MIN_KEY_BYTES`]..=[`MAX_KEY_BYTES`] bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Key, AuthError> {
        if bytes.len() < MIN_KEY_BYTES || bytes.len() > MAX_KEY_BYTES {
            return Err(AuthError::KeyLength(bytes.len()));
        }
        Ok(Key(bytes))
    }

    /// A 32-byte key derived from this one for another use:
    /// HMAC-SHA256(key, `context` ‖ each of `parts` after its length as
    /// a u32, little-endian), so no two lists of parts give the same input.
    /// A `context` of its own per use keeps a derived key from ever being
    /// this key's tag of anything else (the handshake's contexts are
    /// [`COORDINATOR_CONTEXT`] and [`AGENT_CONTEXT`]).
    pub fn derive(&self, context: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.mac();
        mac.update(context);
        for p in parts {
            // A part's length is far below 4 GiB (a name, an address).
            mac.update(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
            mac.update(p);
        }
        mac.finalize().into_bytes().into()
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        }
    }

    fn tag(&self, context: &[u8], agent_nonce: &[u8], coord_nonce: &[u8]) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(context);
        mac.update(agent_nonce);
        mac.update(coord_nonce);
        mac
    }
}

/// Why a handshake failed. Each is one line for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A key of the wrong size.
    #[error("a key must hold {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, this one has {0}")]
    KeyLength(usize),
    /// The frame is not an auth frame at all.
    #[error("not an authentication frame")]
    NotAuth,
    /// An auth frame of the wrong size or kind.
    #[error("malformed authentication frame: {0}")]
    Malformed(String),
    /// A well-formed frame that does not belong at this step.
    #[error("expected {expected}, got {got}")]
    Unexpected {
        /// The frame the step needs.
        expected: &'static str,
        /// The frame that came.
        got: &'static str,
    },
    /// The coordinator's tag does not match: it holds another key.
    #[error("authentication failed: the coordinator's key does not match this agent's")]
    CoordinatorKey,
    /// The agent's proof does not match: it holds another key.
    #[error("authentication failed: the agent's key does not match ours")]
    AgentKey,
    /// The machine already finished or failed.
    #[error("the handshake is over")]
    Over,
}

/// One parsed auth frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFrame {
    /// The coordinator holds a key and asks for a challenge.
    Begin,
    /// The agent's nonce.
    Challenge {
        /// Fresh random bytes of the agent.
        agent_nonce: [u8; NONCE_BYTES],
    },
    /// The coordinator's proof.
    Response {
        /// Fresh random bytes of the coordinator.
        coord_nonce: [u8; NONCE_BYTES],
        /// HMAC over [`COORDINATOR_CONTEXT`] and both nonces.
        tag: [u8; TAG_BYTES],
    },
    /// The agent's proof.
    Proof {
        /// HMAC over [`AGENT_CONTEXT`] and both nonces.
        tag: [u8; TAG_BYTES],
    },
}

impl AuthFrame {
    fn name(&self) -> &'static str {
        match self {
            AuthFrame::Begin => "begin",
            AuthFrame::Challenge { .. } => "challenge",
            AuthFrame::Response { .. } => "response",
            AuthFrame::Proof { .. } => "proof",
        }
    }

    /// The frame's payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        match self {
            AuthFrame::Begin => out.push(KIND_BEGIN),
            AuthFrame::Challenge { agent_nonce } => {
                out.push(KIND_CHALLENGE);
                out.extend_from_slice(agent_nonce);
            }
            AuthFrame::Response { coord_nonce, tag } => {
                out.push(KIND_RESPONSE);
                out.extend_from_slice(coord_nonce);
                out.extend_from_slice(tag);
            }
            AuthFrame::Proof { tag } => {
                out.push(KIND_PROOF);
                out.extend_from_slice(tag);
            }
        }
        out
    }

    /// Parses a payload: the magic, a known kind, and exactly that kind's
    /// size, or an error. Never panics.
    pub fn parse(payload: &[u8]) -> Result<AuthFrame, AuthError> {
        if !is_auth_frame(payload) {
            return Err(AuthError::NotAuth);
        }
        let Some((&kind, body)) = payload[MAGIC.len()..].split_first() else {
            return Err(AuthError::Malformed("no kind byte".into()));
        };
        let want = match kind {
            KIND_BEGIN => 0,
            KIND_CHALLENGE | KIND_PROOF => NONCE_BYTES,
            KIND_RESPONSE => NONCE_BYTES + TAG_BYTES,
            other => return Err(AuthError::Malformed(format!("unknown kind {other}"))),
        };
        if body.len() != want {
            return Err(AuthError::Malformed(format!(
                "kind {kind} carries {want} bytes, got {}",
                body.len()
            )));
        }
        let arr = |b: &[u8]| -> [u8; 32] {
            let mut a = [0u8; 32];
            a.copy_from_slice(b);
            a
        };
        Ok(match kind {
            KIND_BEGIN => AuthFrame::Begin,
            KIND_CHALLENGE => AuthFrame::Challenge {
                agent_nonce: arr(body),
            },
            KIND_RESPONSE => AuthFrame::Response {
                coord_nonce: arr(&body[..NONCE_BYTES]),
                tag: arr(&body[NONCE_BYTES..]),
            },
            _ => AuthFrame::Proof { tag: arr(body) },
        })
    }
}

/// Whether `payload` is an auth frame (starts with the auth magic); a
/// protocol message never does.
pub fn is_auth_frame(payload: &[u8]) -> bool {
    payload.len() >= HEAD_BYTES && payload.starts_with(MAGIC)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentStep {
    AwaitBegin,
    AwaitResponse,
    Done,
    Failed,
}

/// The agent's side: send [`AgentHandshake::challenge`], feed each received
/// payload to [`AgentHandshake::on_frame`] until it returns a proof to send.
#[derive(Debug)]
pub struct AgentHandshake {
    key: Key,
    agent_nonce: [u8; NONCE_BYTES],
    step: AgentStep,
}

impl AgentHandshake {
    /// A handshake with a fresh random `agent_nonce` (never reuse one).
    pub fn new(key: Key, agent_nonce: [u8; NONCE_BYTES]) -> AgentHandshake {
        AgentHandshake {
            key,
            agent_nonce,
            step: AgentStep::AwaitBegin,
        }
    }

    /// The challenge payload to send first.
    pub fn challenge(&self) -> Vec<u8> {
        AuthFrame::Challenge {
            agent_nonce: self.agent_nonce,
        }
        .encode()
    }

    /// Takes the next payload. `Ok(None)`: wait for another; `Ok(Some(p))`:
    /// the coordinator proved the key, send `p` (the agent's proof) and
    /// start the session. Any error ends the handshake for good.
    pub fn on_frame(&mut self, payload: &[u8]) -> Result<Option<Vec<u8>>, AuthError> {
        let result = self.step_with(payload);
        if result.is_err() {
            self.step = AgentStep::Failed;
        }
        result
    }

    fn step_with(&mut self, payload: &[u8]) -> Result<Option<Vec<u8>>, AuthError> {
        let frame = AuthFrame::parse(payload)?;
        match (self.step, frame) {
            (AgentStep::AwaitBegin, AuthFrame::Begin) => {
                self.step = AgentStep::AwaitResponse;
                Ok(None)
            }
            (AgentStep::AwaitResponse, AuthFrame::Response { coord_nonce, tag }) => {
                self.key
                    .tag(COORDINATOR_CONTEXT, &self.agent_nonce, &coord_nonce)
                    .verify_slice(&tag)
                    .map_err(|_| AuthError::CoordinatorKey)?;
                let proof = self
                    .key
                    .tag(AGENT_CONTEXT, &self.agent_nonce, &coord_nonce)
                    .finalize()
                    .into_bytes();
                self.step = AgentStep::Done;
                let mut tag = [0u8; TAG_BYTES];
                tag.copy_from_slice(&proof);
                Ok(Some(AuthFrame::Proof { tag }.encode()))
            }
            (AgentStep::AwaitBegin, f) => Err(AuthError::Unexpected {
                expected: "begin",
                got: f.name(),
            }),
            (AgentStep::AwaitResponse, f) => Err(AuthError::Unexpected {
                expected: "response",
                got: f.name(),
            }),
            (AgentStep::Done | AgentStep::Failed, _) => Err(AuthError::Over),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CoordStep {
    AwaitChallenge,
    AwaitProof,
    Done,
    Failed,
}

/// The coordinator's side: send [`CoordinatorHandshake::begin`], answer the
/// challenge with [`CoordinatorHandshake::on_challenge`], check the agent's
/// proof with [`CoordinatorHandshake::on_proof`].
#[derive(Debug)]
pub struct CoordinatorHandshake {
    key: Key,
    coord_nonce: [u8; NONCE_BYTES],
    agent_nonce: [u8; NONCE_BYTES],
    step: CoordStep,
}

impl CoordinatorHandshake {
    /// A handshake with a fresh random `coord_nonce`.
    pub fn new(key: Key, coord_nonce: [u8; NONCE_BYTES]) -> CoordinatorHandshake {
        CoordinatorHandshake {
            key,
            coord_nonce,
            agent_nonce: [0; NONCE_BYTES],
            step: CoordStep::AwaitChallenge,
        }
    }

    /// The payload to send first.
    pub fn begin(&self) -> Vec<u8> {
        AuthFrame::Begin.encode()
    }

    /// Takes the agent's challenge; returns the response to send.
    pub fn on_challenge(&mut self, payload: &[u8]) -> Result<Vec<u8>, AuthError> {
        if self.step != CoordStep::AwaitChallenge {
            return Err(AuthError::Over);
        }
        self.step = CoordStep::Failed;
        let agent_nonce = match AuthFrame::parse(payload)? {
            AuthFrame::Challenge { agent_nonce } => agent_nonce,
            f => {
                return Err(AuthError::Unexpected {
                    expected: "challenge",
                    got: f.name(),
                })
            }
        };
        self.agent_nonce = agent_nonce;
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(
            &self
                .key
                .tag(COORDINATOR_CONTEXT, &agent_nonce, &self.coord_nonce)
                .finalize()
                .into_bytes(),
        );
        self.step = CoordStep::AwaitProof;
        Ok(AuthFrame::Response {
            coord_nonce: self.coord_nonce,
            tag,
        }
        .encode())
    }

    /// Checks the agent's proof; `Ok` means both ends hold the same key.
    pub fn on_proof(&mut self, payload: &[u8]) -> Result<(), AuthError> {
        if self.step != CoordStep::AwaitProof {
            return Err(AuthError::Over);
        }
        self.step = CoordStep::Failed;
        let tag = match AuthFrame::parse(payload)? {
            AuthFrame::Proof { tag } => tag,
            f => {
                return Err(AuthError::Unexpected {
                    expected: "proof",
                    got: f.name(),
                })
            }
        };
        self.key
            .tag(AGENT_CONTEXT, &self.agent_nonce, &self.coord_nonce)
            .verify_slice(&tag)
            .map_err(|_| AuthError::AgentKey)?;
        self.step = CoordStep::Done;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::decode_request;
    use crate::message::{Request, PROTOCOL_VERSION};

    fn key(b: u8) -> Key {
        Key::from_bytes(vec![b; 32]).expect("key")
    }

    #[test]
    fn derived_keys_differ_by_key_context_and_parts_and_never_collide_by_concatenation() {
        let k = key(1);
        let d = k.derive(b"ctx", &[b"ab", b"c"]);
        assert_eq!(d, key(1).derive(b"ctx", &[b"ab", b"c"]));
        assert_ne!(d, key(2).derive(b"ctx", &[b"ab", b"c"]));
        assert_ne!(d, k.derive(b"ctx2", &[b"ab", b"c"]));
        // The same bytes split otherwise are other parts.
        assert_ne!(d, k.derive(b"ctx", &[b"a", b"bc"]));
        assert_ne!(d, k.derive(b"ctx", &[b"abc"]));
        assert_ne!(k.derive(b"ctx", &[]), k.derive(b"ctx", &[b""]));
    }

    /// Runs a handshake in memory; the agent's proof payload or its error.
    fn handshake(
        agent_key: Key,
        coord_key: Key,
        an: u8,
        cn: u8,
    ) -> (Result<Vec<u8>, AuthError>, CoordinatorHandshake) {
        let mut agent = AgentHandshake::new(agent_key, [an; 32]);
        let mut coord = CoordinatorHandshake::new(coord_key, [cn; 32]);
        assert_eq!(agent.on_frame(&coord.begin()), Ok(None));
        let response = coord.on_challenge(&agent.challenge()).expect("response");
        let proof = agent
            .on_frame(&response)
            .map(|p| p.expect("a proof after the response"));
        (proof, coord)
    }

    #[test]
    fn the_right_key_is_accepted_both_ways() {
        let (proof, mut coord) = handshake(key(7), key(7), 1, 2);
        let proof = proof.expect("agent accepts");
        assert_eq!(coord.on_proof(&proof), Ok(()));
        assert_eq!(coord.on_proof(&proof), Err(AuthError::Over));
    }

    #[test]
    fn a_wrong_key_is_refused_and_no_request_is_parsed_after_it() {
        let mut agent = AgentHandshake::new(key(7), [1; 32]);
        let mut coord = CoordinatorHandshake::new(key(8), [2; 32]);
        assert_eq!(agent.on_frame(&coord.begin()), Ok(None));
        let response = coord.on_challenge(&agent.challenge()).expect("response");
        assert_eq!(agent.on_frame(&response), Err(AuthError::CoordinatorKey));
        // A request sent in place of the proof is not even an auth frame, and
        // the failed machine accepts nothing more.
        let hello = serde_json::to_vec(&Request::Hello {
            protocol: PROTOCOL_VERSION,
            version: "x".into(),
        })
        .expect("json");
        assert!(decode_request(&hello).is_ok());
        assert_eq!(agent.on_frame(&hello), Err(AuthError::NotAuth));
        assert_eq!(agent.on_frame(&response), Err(AuthError::Over));
    }

    #[test]
    fn a_request_in_place_of_the_handshake_is_refused() {
        let mut agent = AgentHandshake::new(key(7), [1; 32]);
        let hello = br#"{"hello":{"protocol":1,"version":"x"}}"#;
        assert_eq!(agent.on_frame(hello), Err(AuthError::NotAuth));
    }

    #[test]
    fn the_agent_detects_a_coordinator_with_another_key() {
        // A coordinator's proof checked against an agent with another key
        // fails on the agent; an agent proof from another key fails on the
        // coordinator.
        let mut honest = AgentHandshake::new(key(9), [1; 32]);
        let mut coord = CoordinatorHandshake::new(key(7), [2; 32]);
        let mut real = AgentHandshake::new(key(7), [1; 32]);
        honest.on_frame(&coord.begin()).expect("begin");
        real.on_frame(&coord.begin()).expect("begin");
        let response = coord.on_challenge(&real.challenge()).expect("response");
        let good_proof = real.on_frame(&response).expect("ok").expect("proof");
        assert!(honest.on_frame(&response).is_err());
        let forged = AuthFrame::Proof { tag: [0; 32] }.encode();
        assert_eq!(coord.on_proof(&forged), Err(AuthError::AgentKey));
        assert_ne!(forged, good_proof);
    }

    #[test]
    fn a_replayed_response_is_refused() {
        let mut first = AgentHandshake::new(key(7), [1; 32]);
        let mut coord = CoordinatorHandshake::new(key(7), [2; 32]);
        first.on_frame(&coord.begin()).expect("begin");
        let recorded = coord.on_challenge(&first.challenge()).expect("response");
        assert!(first.on_frame(&recorded).expect("ok").is_some());
        // The next session draws a new agent nonce; the recorded response
        // answers the old one.
        let mut second = AgentHandshake::new(key(7), [3; 32]);
        second.on_frame(&AuthFrame::Begin.encode()).expect("begin");
        assert_eq!(second.on_frame(&recorded), Err(AuthError::CoordinatorKey));
        // Replaying into the finished session fails too.
        assert_eq!(first.on_frame(&recorded), Err(AuthError::Over));
    }

    #[test]
    fn truncated_oversized_and_unknown_frames_are_refused() {
        let good = AuthFrame::Response {
            coord_nonce: [1; 32],
            tag: [2; 32],
        }
        .encode();
        assert!(AuthFrame::parse(&good).is_ok());
        for cut in 0..good.len() {
            assert!(AuthFrame::parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            AuthFrame::parse(&long),
            Err(AuthError::Malformed(_))
        ));
        let mut unknown = good;
        unknown[4] = 99;
        assert!(matches!(
            AuthFrame::parse(&unknown),
            Err(AuthError::Malformed(_))
        ));
        assert_eq!(
            AuthFrame::parse(&vec![0u8; 70_000]),
            Err(AuthError::NotAuth)
        );
        // Out of order: a response before begin.
        let mut agent = AgentHandshake::new(key(7), [1; 32]);
        assert!(matches!(
            agent.on_frame(&AuthFrame::Proof { tag: [0; 32] }.encode()),
            Err(AuthError::Unexpected { .. })
        ));
    }

    #[test]
    fn frames_round_trip_and_keys_have_a_size() {
        for f in [
            AuthFrame::Begin,
            AuthFrame::Challenge {
                agent_nonce: [5; 32],
            },
            AuthFrame::Proof { tag: [6; 32] },
        ] {
            assert_eq!(AuthFrame::parse(&f.encode()), Ok(f));
        }
        assert!(Key::from_bytes(vec![1; 15]).is_err());
        assert!(Key::from_bytes(vec![1; 16]).is_ok());
        assert!(format!("{:?}", key(3)).contains("32 bytes"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_parser(bytes in proptest::collection::vec(0u8..=255, 0..200)) {
            let _ = AuthFrame::parse(&bytes);
            let mut agent = AgentHandshake::new(key(7), [1; 32]);
            let _ = agent.on_frame(&bytes);
        }
    }
}
