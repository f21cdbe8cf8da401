//! The data connection's proof that both ends belong to the same session,
//! with no I/O: a fresh random [`DataToken`] the coordinator gives, over
//! the control connection, to every end of one point's flows, and the three
//! fixed-size messages that prove knowledge of it on a new data connection
//! before any payload moves.
//!
//! 1. connector → listener: [`ConnectorProof::hello`], a fresh connector
//!    nonce,
//! 2. listener → connector: a fresh listener nonce and
//!    HMAC-SHA256(token, [`LISTENER_CONTEXT`] ‖ connector nonce ‖ listener
//!    nonce); the connector checks it ([`ConnectorProof::on_answer`]) and
//!    sends nothing more unless it matches,
//! 3. connector → listener: HMAC-SHA256(token, [`CONNECTOR_CONTEXT`] ‖
//!    connector nonce ‖ listener nonce); the listener checks it
//!    ([`ListenerProof::on_confirm`]) before its role starts.
//!
//! The answer and the confirmation end in zeros, so that each end sends
//! [`PROOF_STREAM_BYTES`] in all and the payload keeps the stream's
//! alignment.
//!
//! So an address that is not a netgap end of this point (a plain sink, a
//! port of another service) gets a 20-byte nonce and never a payload
//! byte, and a stranger connecting to a data listener is refused. The token
//! itself never crosses a data connection. Tags are compared in constant
//! time.
//!
//! Once the proof holds, both ends can derive the same [`FlowKey`]
//! (HMAC-SHA256(token, [`FLOW_KEY_CONTEXT`] ‖ connector nonce ‖ listener
//! nonce)): a secret of that one connection, for a transport that
//! authenticates its own frames (xdp). It is never sent.
//!
//! Flows of datagrams, which have no connection, prove the same token with
//! [`DatagramConnectorProof`] and [`DatagramListenerProof`]: the same three
//! steps in the payload of the flow's opening datagrams, with a listener
//! that keeps no state for a peer before its confirmation verifies and
//! never answers with more bytes than it was sent.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a [`DataToken`].
pub const TOKEN_BYTES: usize = 32;
/// Bytes of a data-proof nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes of a data-proof tag (HMAC-SHA256).
pub const TAG_BYTES: usize = 32;
/// First bytes of the connector's hello and the listener's answer
/// (version 2: the answer and the confirmation are padded, below).
const MAGIC: &[u8; 4] = b"NGD2";
/// Bytes each end sends in the proof, both ways alike: a whole number of
/// cache-line pairs, so the payload after it starts where the byte stream
/// started. A transport whose stream is a ring in memory (shm, the preload
/// library's channels) places byte `i` of the stream at offset `i` of a
/// page-aligned region, so with an odd-sized proof (52 bytes each way, as
/// in version 1) every 64-byte message straddled two cache lines and cost
/// two line transfers instead of one.
pub const PROOF_STREAM_BYTES: usize = 128;
/// Bytes of the connector's hello: magic and nonce.
pub const HELLO_BYTES: usize = MAGIC.len() + NONCE_BYTES;
/// Bytes of the listener's answer: magic, nonce and tag, then zeros up to
/// [`PROOF_STREAM_BYTES`].
pub const ANSWER_BYTES: usize = PROOF_STREAM_BYTES;
/// Bytes of the connector's confirmation: its tag, then zeros up to
/// [`PROOF_STREAM_BYTES`] with the hello.
pub const CONFIRM_BYTES: usize = PROOF_STREAM_BYTES - HELLO_BYTES;
/// Where the listener's tag ends in its answer; zeros follow.
const ANSWER_TAG_END: usize = MAGIC.len() + NONCE_BYTES + TAG_BYTES;

const _: () = assert!(ANSWER_TAG_END <= ANSWER_BYTES && TAG_BYTES <= CONFIRM_BYTES);

/// Whether the padding after a message's fields is all zeros.
fn zeros(padding: &[u8]) -> bool {
    padding.iter().all(|&b| b == 0)
}
/// Domain separation of the listener's tag.
pub const LISTENER_CONTEXT: &[u8] = b"netgap data v1: listener";
/// Domain separation of the connector's tag.
pub const CONNECTOR_CONTEXT: &[u8] = b"netgap data v1: connector";
/// Domain separation of a proven connection's [`FlowKey`].
pub const FLOW_KEY_CONTEXT: &[u8] = b"netgap data v1: flow key";
/// Bytes of a [`FlowKey`].
pub const FLOW_KEY_BYTES: usize = 32;

/// The secret one proven data connection's two ends share: derived from
/// the point's token and both ends' nonces, so it differs for every
/// connection and is known to no one who lacks the token. Its bytes never
/// appear in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct FlowKey([u8; FLOW_KEY_BYTES]);

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FlowKey(..)")
    }
}

impl FlowKey {
    /// A key from its bytes (a test's fixed key, or one derived here).
    pub fn from_bytes(bytes: [u8; FLOW_KEY_BYTES]) -> FlowKey {
        FlowKey(bytes)
    }

    /// Its bytes, to key a MAC with.
    pub fn bytes(&self) -> &[u8; FLOW_KEY_BYTES] {
        &self.0
    }
}

/// The secret every end of one point's data connections shares: drawn
/// fresh by the coordinator for each point, sent to each agent with the
/// point. Travels as 64 hex digits; its bytes never appear in `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DataToken([u8; TOKEN_BYTES]);

impl fmt::Debug for DataToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataToken(..)")
    }
}

impl DataToken {
    /// A token from fresh random bytes (never reuse them).
    pub fn from_bytes(bytes: [u8; TOKEN_BYTES]) -> DataToken {
        DataToken(bytes)
    }

    fn tag(&self, context: &[u8], connector: &[u8], listener: &[u8]) -> HmacSha256 {
        // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
        let mut mac = match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(context);
        mac.update(connector);
        mac.update(listener);
        mac
    }
}

impl DataToken {
    fn flow_key(&self, connector: &[u8], listener: &[u8]) -> FlowKey {
        let mut key = [0u8; FLOW_KEY_BYTES];
        key.copy_from_slice(
            &self
                .tag(FLOW_KEY_CONTEXT, connector, listener)
                .finalize()
                .into_bytes(),
        );
        FlowKey(key)
    }
}

impl From<DataToken> for String {
    fn from(t: DataToken) -> String {
        t.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A data token's text that is not one: it is exactly
/// `2 * TOKEN_BYTES` hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a data token is {} hex digits", TOKEN_BYTES * 2)]
pub struct BadToken;

impl TryFrom<String> for DataToken {
    type Error = BadToken;

    fn try_from(s: String) -> Result<DataToken, BadToken> {
        if s.len() != TOKEN_BYTES * 2 || !s.is_ascii() {
            return Err(BadToken);
        }
        let mut out = [0u8; TOKEN_BYTES];
        for (i, byte) in out.iter_mut().enumerate() {
            let pair = s.get(2 * i..2 * i + 2).ok_or(BadToken)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| BadToken)?;
        }
        Ok(DataToken(out))
    }
}

/// Why a data connection's far end was refused. One line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataProofError {
    /// The far end sent something that is not the proof's next message.
    #[error("the far end did not answer as a netgap end of this session")]
    NotNetgap,
    /// The far end's tag does not match: it is not part of this point.
    #[error("the far end does not belong to this session (its proof does not match)")]
    WrongSession,
}

/// The connecting end's side: send [`ConnectorProof::hello`], read
/// [`ANSWER_BYTES`] and pass them to [`ConnectorProof::on_answer`], send
/// the confirmation it returns, and only then the payload.
#[derive(Debug)]
pub struct ConnectorProof {
    token: DataToken,
    nonce: [u8; NONCE_BYTES],
}

impl ConnectorProof {
    /// A proof with a fresh random `nonce`.
    pub fn new(token: DataToken, nonce: [u8; NONCE_BYTES]) -> ConnectorProof {
        ConnectorProof { token, nonce }
    }

    /// The first message.
    pub fn hello(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[..MAGIC.len()].copy_from_slice(MAGIC);
        out[MAGIC.len()..].copy_from_slice(&self.nonce);
        out
    }

    /// Checks the listener's answer; the confirmation to send when it holds
    /// the token. Never panics.
    pub fn on_answer(&self, answer: &[u8]) -> Result<[u8; CONFIRM_BYTES], DataProofError> {
        if answer.len() != ANSWER_BYTES
            || !answer.starts_with(MAGIC)
            || !zeros(&answer[ANSWER_TAG_END..])
        {
            return Err(DataProofError::NotNetgap);
        }
        let (nonce, tag) = answer[MAGIC.len()..ANSWER_TAG_END].split_at(NONCE_BYTES);
        self.token
            .tag(LISTENER_CONTEXT, &self.nonce, nonce)
            .verify_slice(tag)
            .map_err(|_| DataProofError::WrongSession)?;
        let mut confirm = [0u8; CONFIRM_BYTES];
        confirm[..TAG_BYTES].copy_from_slice(
            &self
                .token
                .tag(CONNECTOR_CONTEXT, &self.nonce, nonce)
                .finalize()
                .into_bytes(),
        );
        Ok(confirm)
    }

    /// The connection's [`FlowKey`], from the listener's `answer`, which
    /// is checked again: no key comes from an answer that does not prove
    /// the token. Never panics.
    pub fn flow_key(&self, answer: &[u8]) -> Result<FlowKey, DataProofError> {
        self.on_answer(answer)?;
        let nonce = &answer[MAGIC.len()..MAGIC.len() + NONCE_BYTES];
        Ok(self.token.flow_key(&self.nonce, nonce))
    }
}

/// The listening end's side: read [`HELLO_BYTES`], answer with
/// [`ListenerProof::on_hello`], read [`CONFIRM_BYTES`] and check them with
/// [`ListenerProof::on_confirm`] before the role starts.
#[derive(Debug)]
pub struct ListenerProof {
    token: DataToken,
    nonce: [u8; NONCE_BYTES],
    connector: Option<[u8; NONCE_BYTES]>,
}

impl ListenerProof {
    /// A proof with a fresh random `nonce`.
    pub fn new(token: DataToken, nonce: [u8; NONCE_BYTES]) -> ListenerProof {
        ListenerProof {
            token,
            nonce,
            connector: None,
        }
    }

    /// Takes the connector's hello; the answer to send. Never panics.
    pub fn on_hello(&mut self, hello: &[u8]) -> Result<[u8; ANSWER_BYTES], DataProofError> {
        if hello.len() != HELLO_BYTES || !hello.starts_with(MAGIC) || self.connector.is_some() {
            return Err(DataProofError::NotNetgap);
        }
        let mut connector = [0u8; NONCE_BYTES];
        connector.copy_from_slice(&hello[MAGIC.len()..]);
        self.connector = Some(connector);
        let mut out = [0u8; ANSWER_BYTES];
        out[..MAGIC.len()].copy_from_slice(MAGIC);
        out[MAGIC.len()..MAGIC.len() + NONCE_BYTES].copy_from_slice(&self.nonce);
        out[MAGIC.len() + NONCE_BYTES..ANSWER_TAG_END].copy_from_slice(
            &self
                .token
                .tag(LISTENER_CONTEXT, &connector, &self.nonce)
                .finalize()
                .into_bytes(),
        );
        Ok(out)
    }

    /// Checks the connector's confirmation: `Ok` means the far end holds
    /// this point's token. Never panics.
    pub fn on_confirm(&self, confirm: &[u8]) -> Result<(), DataProofError> {
        let connector = self.connector.ok_or(DataProofError::NotNetgap)?;
        if confirm.len() != CONFIRM_BYTES || !zeros(&confirm[TAG_BYTES..]) {
            return Err(DataProofError::NotNetgap);
        }
        self.token
            .tag(CONNECTOR_CONTEXT, &connector, &self.nonce)
            .verify_slice(&confirm[..TAG_BYTES])
            .map_err(|_| DataProofError::WrongSession)
    }

    /// The connection's [`FlowKey`], once the connector's `confirm` (checked
    /// again) proved the token. Never panics.
    pub fn flow_key(&self, confirm: &[u8]) -> Result<FlowKey, DataProofError> {
        self.on_confirm(confirm)?;
        let connector = self.connector.ok_or(DataProofError::NotNetgap)?;
        Ok(self.token.flow_key(&connector, &self.nonce))
    }
}

/// Bytes of a datagram connector's hello: its nonce, then zeros up to the
/// size of the listener's answer, so the answer is never bigger than the
/// datagram that caused it (the listener amplifies nothing).
pub const DATAGRAM_HELLO_BYTES: usize = DATAGRAM_ANSWER_BYTES;
/// Bytes of a datagram listener's answer: its nonce and its tag.
pub const DATAGRAM_ANSWER_BYTES: usize = NONCE_BYTES + TAG_BYTES;
/// Bytes of a datagram connector's confirmation: its own nonce (the
/// listener keeps no state to remember it by) and its tag.
pub const DATAGRAM_CONFIRM_BYTES: usize = NONCE_BYTES + TAG_BYTES;
/// Bytes of a datagram listener's secret, which makes its nonces.
pub const DATAGRAM_SECRET_BYTES: usize = 32;
/// Domain separation of the datagram listener's tag.
pub const DATAGRAM_LISTENER_CONTEXT: &[u8] = b"netgap datagram v1: listener";
/// Domain separation of the datagram connector's tag.
pub const DATAGRAM_CONNECTOR_CONTEXT: &[u8] = b"netgap datagram v1: connector";
/// Domain separation of the datagram listener's nonce.
const DATAGRAM_NONCE_CONTEXT: &[u8] = b"netgap datagram v1: nonce";

/// The same proof for flows of datagrams, which have no connection to keep
/// state on: the three messages ride in the payload of the flow's opening
/// datagrams (the caller frames them), and the listener keeps nothing for
/// a peer until its confirmation verifies.
///
/// 1. connector → listener: [`DatagramConnectorProof::hello`], a fresh
///    connector nonce padded with zeros to [`DATAGRAM_HELLO_BYTES`];
/// 2. listener → connector: a listener nonce derived from the listener's
///    own secret, the peer's address and the connector nonce (so a flood
///    of hellos allocates nothing), and HMAC-SHA256(token,
///    [`DATAGRAM_LISTENER_CONTEXT`] ‖ connector nonce ‖ listener nonce); no
///    bigger than the hello;
/// 3. connector → listener: the connector nonce and HMAC-SHA256(token,
///    [`DATAGRAM_CONNECTOR_CONTEXT`] ‖ connector nonce ‖ listener nonce);
///    the listener derives its nonce again from the sender's address and
///    checks the tag ([`DatagramListenerProof::on_confirm`]).
///
/// Hellos and answers may be lost and sent again: the connector keeps one
/// nonce per flow, and the listener answers the same hello with the same
/// bytes. A confirmation binds the sender's address, so one seen on the
/// wire proves nothing from another address; replayed from the same
/// address within one listener's life it registers that address again,
/// which already proved the token.
#[derive(Debug)]
pub struct DatagramConnectorProof {
    token: DataToken,
    nonce: [u8; NONCE_BYTES],
}

impl DatagramConnectorProof {
    /// A proof with a fresh random `nonce` (one per flow).
    pub fn new(token: DataToken, nonce: [u8; NONCE_BYTES]) -> DatagramConnectorProof {
        DatagramConnectorProof { token, nonce }
    }

    /// The hello's payload: the nonce, then zeros.
    pub fn hello(&self) -> [u8; DATAGRAM_HELLO_BYTES] {
        let mut out = [0u8; DATAGRAM_HELLO_BYTES];
        out[..NONCE_BYTES].copy_from_slice(&self.nonce);
        out
    }

    /// Checks the listener's answer; the confirmation's payload to send
    /// when it holds the token. Never panics.
    pub fn on_answer(&self, answer: &[u8]) -> Result<[u8; DATAGRAM_CONFIRM_BYTES], DataProofError> {
        if answer.len() != DATAGRAM_ANSWER_BYTES {
            return Err(DataProofError::NotNetgap);
        }
        let (nonce, tag) = answer.split_at(NONCE_BYTES);
        self.token
            .tag(DATAGRAM_LISTENER_CONTEXT, &self.nonce, nonce)
            .verify_slice(tag)
            .map_err(|_| DataProofError::WrongSession)?;
        let mut confirm = [0u8; DATAGRAM_CONFIRM_BYTES];
        confirm[..NONCE_BYTES].copy_from_slice(&self.nonce);
        confirm[NONCE_BYTES..].copy_from_slice(
            &self
                .token
                .tag(DATAGRAM_CONNECTOR_CONTEXT, &self.nonce, nonce)
                .finalize()
                .into_bytes(),
        );
        Ok(confirm)
    }
}

/// The listening end of datagram flows: one for all its peers, holding no
/// state per peer. Answer each hello with
/// [`DatagramListenerProof::on_hello`]; serve a peer only once
/// [`DatagramListenerProof::on_confirm`] took its confirmation.
pub struct DatagramListenerProof {
    token: DataToken,
    secret: [u8; DATAGRAM_SECRET_BYTES],
}

impl fmt::Debug for DatagramListenerProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatagramListenerProof(..)")
    }
}

/// The bytes of `peer` that its listener nonce binds: family, address and
/// port.
fn peer_bytes(peer: SocketAddr) -> ([u8; 19], usize) {
    let mut out = [0u8; 19];
    let port = peer.port().to_be_bytes();
    match peer.ip() {
        IpAddr::V4(ip) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&ip.octets());
            out[5..7].copy_from_slice(&port);
            (out, 7)
        }
        IpAddr::V6(ip) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&ip.octets());
            out[17..19].copy_from_slice(&port);
            (out, 19)
        }
    }
}

impl DatagramListenerProof {
    /// A listener proving `token`, making its nonces with a fresh random
    /// `secret` (one per listener, never reused).
    pub fn new(token: DataToken, secret: [u8; DATAGRAM_SECRET_BYTES]) -> DatagramListenerProof {
        DatagramListenerProof { token, secret }
    }

    /// The listener nonce for `peer`'s flow with connector nonce
    /// `connector`: the same every time, so nothing is kept between the
    /// answer and the confirmation.
    fn nonce(&self, peer: SocketAddr, connector: &[u8]) -> [u8; NONCE_BYTES] {
        let (peer, len) = peer_bytes(peer);
        let mut mac = match HmacSha256::new_from_slice(&self.secret) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(DATAGRAM_NONCE_CONTEXT);
        mac.update(&peer[..len]);
        mac.update(connector);
        let mut out = [0u8; NONCE_BYTES];
        out.copy_from_slice(&mac.finalize().into_bytes()[..NONCE_BYTES]);
        out
    }

    /// Takes a hello's payload from `peer`; the answer's payload to send
    /// back. Keeps nothing. Never panics.
    pub fn on_hello(
        &self,
        peer: SocketAddr,
        hello: &[u8],
    ) -> Result<[u8; DATAGRAM_ANSWER_BYTES], DataProofError> {
        if hello.len() != DATAGRAM_HELLO_BYTES || hello[NONCE_BYTES..].iter().any(|&b| b != 0) {
            return Err(DataProofError::NotNetgap);
        }
        let connector = &hello[..NONCE_BYTES];
        let nonce = self.nonce(peer, connector);
        let mut out = [0u8; DATAGRAM_ANSWER_BYTES];
        out[..NONCE_BYTES].copy_from_slice(&nonce);
        out[NONCE_BYTES..].copy_from_slice(
            &self
                .token
                .tag(DATAGRAM_LISTENER_CONTEXT, connector, &nonce)
                .finalize()
                .into_bytes(),
        );
        Ok(out)
    }

    /// Checks a confirmation's payload from `peer`: `Ok` means `peer`
    /// holds this point's token and answered this listener. Never panics.
    pub fn on_confirm(&self, peer: SocketAddr, confirm: &[u8]) -> Result<(), DataProofError> {
        if confirm.len() != DATAGRAM_CONFIRM_BYTES {
            return Err(DataProofError::NotNetgap);
        }
        let (connector, tag) = confirm.split_at(NONCE_BYTES);
        let nonce = self.nonce(peer, connector);
        self.token
            .tag(DATAGRAM_CONNECTOR_CONTEXT, connector, &nonce)
            .verify_slice(tag)
            .map_err(|_| DataProofError::WrongSession)
    }
}

/// A fixed token for tests of the protocol.
#[cfg(test)]
pub(crate) fn test_token() -> DataToken {
    DataToken::from_bytes([7; TOKEN_BYTES])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn token(b: u8) -> DataToken {
        DataToken::from_bytes([b; TOKEN_BYTES])
    }

    #[test]
    fn both_ends_with_the_token_prove_it_to_each_other() {
        let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
        let answer = l.on_hello(&c.hello()).unwrap();
        let confirm = c.on_answer(&answer).unwrap();
        assert_eq!(l.on_confirm(&confirm), Ok(()));
        // A hello is not taken twice on one connection.
        assert_eq!(l.on_hello(&c.hello()), Err(DataProofError::NotNetgap));
    }

    #[test]
    fn an_end_of_another_point_or_no_netgap_end_is_refused() {
        let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let mut other = ListenerProof::new(token(9), [3; NONCE_BYTES]);
        let answer = other.on_hello(&c.hello()).unwrap();
        assert_eq!(c.on_answer(&answer), Err(DataProofError::WrongSession));
        // A sink echoing what it got, or answering HTTP, is no netgap end.
        assert_eq!(c.on_answer(&c.hello()), Err(DataProofError::NotNetgap));
        assert_eq!(
            c.on_answer(&[b'H'; ANSWER_BYTES]),
            Err(DataProofError::NotNetgap)
        );
        // A stranger's confirmation on a real listener.
        let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
        l.on_hello(&c.hello()).unwrap();
        assert_eq!(
            l.on_confirm(&[0; CONFIRM_BYTES]),
            Err(DataProofError::WrongSession)
        );
        assert_eq!(
            ListenerProof::new(token(1), [3; 16]).on_confirm(&[0; CONFIRM_BYTES]),
            Err(DataProofError::NotNetgap)
        );
    }

    #[test]
    fn each_way_the_proof_is_a_whole_number_of_line_pairs_padded_with_zeros() {
        assert_eq!(HELLO_BYTES + CONFIRM_BYTES, PROOF_STREAM_BYTES);
        assert_eq!(ANSWER_BYTES, PROOF_STREAM_BYTES);
        assert_eq!(PROOF_STREAM_BYTES % 128, 0);
        let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
        let mut answer = l.on_hello(&c.hello()).unwrap();
        let mut confirm = c.on_answer(&answer).unwrap();
        assert!(zeros(&answer[ANSWER_TAG_END..]) && zeros(&confirm[TAG_BYTES..]));
        assert_eq!(l.on_confirm(&confirm), Ok(()));
        // A byte in the padding makes either message no proof.
        confirm[CONFIRM_BYTES - 1] = 1;
        assert_eq!(l.on_confirm(&confirm), Err(DataProofError::NotNetgap));
        answer[ANSWER_BYTES - 1] = 1;
        assert_eq!(c.on_answer(&answer), Err(DataProofError::NotNetgap));
    }

    #[test]
    fn both_ends_of_a_proven_connection_derive_one_flow_key_no_one_else_does() {
        let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
        assert_eq!(
            l.flow_key(&[0; CONFIRM_BYTES]),
            Err(DataProofError::NotNetgap),
            "no key before a hello"
        );
        let answer = l.on_hello(&c.hello()).unwrap();
        let confirm = c.on_answer(&answer).unwrap();
        let key = c.flow_key(&answer).unwrap();
        assert_eq!(l.flow_key(&confirm), Ok(key.clone()));
        assert_eq!(format!("{key:?}"), "FlowKey(..)");
        // Not the token, and not a tag that crossed the wire.
        assert_ne!(key.bytes(), &[1; TOKEN_BYTES]);
        assert_ne!(
            &key.bytes()[..],
            &answer[MAGIC.len() + NONCE_BYTES..ANSWER_TAG_END]
        );
        assert_ne!(&key.bytes()[..], &confirm[..TAG_BYTES]);
        // No key from a forged confirmation or answer.
        assert_eq!(
            l.flow_key(&[0; CONFIRM_BYTES]),
            Err(DataProofError::WrongSession)
        );
        let other = ListenerProof::new(token(9), [3; NONCE_BYTES]).on_hello(&c.hello());
        assert_eq!(
            c.flow_key(&other.unwrap()),
            Err(DataProofError::WrongSession)
        );
        // Another connection of the same point has another key.
        let c2 = ConnectorProof::new(token(1), [4; NONCE_BYTES]);
        let mut l2 = ListenerProof::new(token(1), [3; NONCE_BYTES]);
        let answer2 = l2.on_hello(&c2.hello()).unwrap();
        assert_ne!(c2.flow_key(&answer2).unwrap(), key);
    }

    #[test]
    fn tokens_travel_as_hex_and_hide_in_debug() {
        let t = token(0xab);
        let s: String = t.clone().into();
        assert_eq!(s.len(), 64);
        assert_eq!(DataToken::try_from(s), Ok(t.clone()));
        assert!(DataToken::try_from("ab".to_string()).is_err());
        assert!(DataToken::try_from("zz".repeat(32)).is_err());
        assert!(DataToken::try_from("é".repeat(32)).is_err());
        assert_eq!(format!("{t:?}"), "DataToken(..)");
    }

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn datagram_ends_with_the_token_prove_it_and_the_answer_is_no_bigger() {
        const { assert!(DATAGRAM_ANSWER_BYTES <= DATAGRAM_HELLO_BYTES) };
        let c = DatagramConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let l = DatagramListenerProof::new(token(1), [3; DATAGRAM_SECRET_BYTES]);
        let from = peer("10.0.0.1:5000");
        let answer = l.on_hello(from, &c.hello()).unwrap();
        // A lost answer is asked for again and comes back the same.
        assert_eq!(l.on_hello(from, &c.hello()).unwrap(), answer);
        let confirm = c.on_answer(&answer).unwrap();
        assert_eq!(l.on_confirm(from, &confirm), Ok(()));
        // Over IPv6 too.
        let v6 = peer("[fd00::1]:5000");
        let confirm = c.on_answer(&l.on_hello(v6, &c.hello()).unwrap()).unwrap();
        assert_eq!(l.on_confirm(v6, &confirm), Ok(()));
    }

    #[test]
    fn a_datagram_end_of_another_point_or_no_netgap_end_is_refused() {
        let c = DatagramConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let from = peer("10.0.0.1:5000");
        // A listener of another point.
        let other = DatagramListenerProof::new(token(9), [3; DATAGRAM_SECRET_BYTES]);
        let answer = other.on_hello(from, &c.hello()).unwrap();
        assert_eq!(c.on_answer(&answer), Err(DataProofError::WrongSession));
        // A sink echoing the hello, and answers of the wrong size.
        assert_eq!(c.on_answer(&c.hello()), Err(DataProofError::WrongSession));
        assert_eq!(c.on_answer(&[0; 20]), Err(DataProofError::NotNetgap));
        // A connector of another point.
        let l = DatagramListenerProof::new(token(1), [3; DATAGRAM_SECRET_BYTES]);
        let stranger = DatagramConnectorProof::new(token(9), [2; NONCE_BYTES]);
        let answer = l.on_hello(from, &stranger.hello()).unwrap();
        assert_eq!(
            stranger.on_answer(&answer),
            Err(DataProofError::WrongSession)
        );
        // A hello with anything but zeros after the nonce is no netgap's.
        let mut bad = c.hello();
        bad[DATAGRAM_HELLO_BYTES - 1] = 1;
        assert_eq!(l.on_hello(from, &bad), Err(DataProofError::NotNetgap));
        assert_eq!(l.on_hello(from, &bad[..20]), Err(DataProofError::NotNetgap));
    }

    #[test]
    fn a_datagram_answer_or_confirmation_replayed_or_forged_is_refused() {
        let from = peer("10.0.0.1:5000");
        let l = DatagramListenerProof::new(token(1), [3; DATAGRAM_SECRET_BYTES]);
        let first = DatagramConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let old_answer = l.on_hello(from, &first.hello()).unwrap();
        let confirm = first.on_answer(&old_answer).unwrap();
        // An answer seen on the wire, replayed to a flow with a new nonce.
        let second = DatagramConnectorProof::new(token(1), [4; NONCE_BYTES]);
        assert_eq!(
            second.on_answer(&old_answer),
            Err(DataProofError::WrongSession)
        );
        // A confirmation seen on the wire, replayed from another address.
        assert_eq!(
            l.on_confirm(peer("10.0.0.2:5000"), &confirm),
            Err(DataProofError::WrongSession)
        );
        assert_eq!(
            l.on_confirm(peer("10.0.0.1:5001"), &confirm),
            Err(DataProofError::WrongSession)
        );
        // Or to another listener of the same point (a restarted server).
        let restarted = DatagramListenerProof::new(token(1), [5; DATAGRAM_SECRET_BYTES]);
        assert_eq!(
            restarted.on_confirm(from, &confirm),
            Err(DataProofError::WrongSession)
        );
        // A confirmation made up without the token, or with a bit flipped.
        assert_eq!(
            l.on_confirm(from, &[0; DATAGRAM_CONFIRM_BYTES]),
            Err(DataProofError::WrongSession)
        );
        let mut flipped = confirm;
        flipped[NONCE_BYTES] ^= 1;
        assert_eq!(
            l.on_confirm(from, &flipped),
            Err(DataProofError::WrongSession)
        );
        let mut flipped = confirm;
        flipped[0] ^= 1;
        assert_eq!(
            l.on_confirm(from, &flipped),
            Err(DataProofError::WrongSession)
        );
        assert_eq!(
            l.on_confirm(from, &confirm[..40]),
            Err(DataProofError::NotNetgap)
        );
        assert_eq!(l.on_confirm(from, &confirm), Ok(()));
        assert_eq!(format!("{l:?}"), "DatagramListenerProof(..)");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_either_end(bytes in proptest::collection::vec(0u8..=255, 0..80)) {
            let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
            let _ = c.on_answer(&bytes);
            let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
            let _ = l.on_hello(&bytes);
            let _ = l.on_confirm(&bytes);
            let d = DatagramConnectorProof::new(token(1), [2; NONCE_BYTES]);
            let _ = d.on_answer(&bytes);
            let dl = DatagramListenerProof::new(token(1), [3; DATAGRAM_SECRET_BYTES]);
            let from: SocketAddr = "10.0.0.1:5000".parse().unwrap();
            let _ = dl.on_hello(from, &bytes);
            let _ = dl.on_confirm(from, &bytes);
        }
    }
}
