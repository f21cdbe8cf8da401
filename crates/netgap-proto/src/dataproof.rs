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
//! So an address that is not a netgap end of this point (a plain sink, a
//! port of another service) gets a 20-byte nonce and never a payload
//! byte, and a stranger connecting to a data listener is refused. The token
//! itself never crosses a data connection. Tags are compared in constant
//! time.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a [`DataToken`].
pub const TOKEN_BYTES: usize = 32;
/// Bytes of a data-proof nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes of a data-proof tag (HMAC-SHA256).
pub const TAG_BYTES: usize = 32;
/// First bytes of the connector's hello and the listener's answer.
const MAGIC: &[u8; 4] = b"NGD1";
/// Bytes of the connector's hello: magic and nonce.
pub const HELLO_BYTES: usize = MAGIC.len() + NONCE_BYTES;
/// Bytes of the listener's answer: magic, nonce and tag.
pub const ANSWER_BYTES: usize = MAGIC.len() + NONCE_BYTES + TAG_BYTES;
/// Bytes of the connector's confirmation: its tag.
pub const CONFIRM_BYTES: usize = TAG_BYTES;
/// Domain separation of the listener's tag.
pub const LISTENER_CONTEXT: &[u8] = b"netgap data v1: listener";
/// Domain separation of the connector's tag.
pub const CONNECTOR_CONTEXT: &[u8] = b"netgap data v1: connector";

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

impl From<DataToken> for String {
    fn from(t: DataToken) -> String {
        t.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl TryFrom<String> for DataToken {
    type Error = String;

    fn try_from(s: String) -> Result<DataToken, String> {
        let bad = || format!("a data token is {} hex digits", TOKEN_BYTES * 2);
        if s.len() != TOKEN_BYTES * 2 || !s.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; TOKEN_BYTES];
        for (i, byte) in out.iter_mut().enumerate() {
            let pair = s.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
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
        if answer.len() != ANSWER_BYTES || !answer.starts_with(MAGIC) {
            return Err(DataProofError::NotNetgap);
        }
        let (nonce, tag) = answer[MAGIC.len()..].split_at(NONCE_BYTES);
        self.token
            .tag(LISTENER_CONTEXT, &self.nonce, nonce)
            .verify_slice(tag)
            .map_err(|_| DataProofError::WrongSession)?;
        let mut confirm = [0u8; CONFIRM_BYTES];
        confirm.copy_from_slice(
            &self
                .token
                .tag(CONNECTOR_CONTEXT, &self.nonce, nonce)
                .finalize()
                .into_bytes(),
        );
        Ok(confirm)
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
        out[MAGIC.len() + NONCE_BYTES..].copy_from_slice(
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
        if confirm.len() != CONFIRM_BYTES {
            return Err(DataProofError::NotNetgap);
        }
        self.token
            .tag(CONNECTOR_CONTEXT, &connector, &self.nonce)
            .verify_slice(confirm)
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

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_either_end(bytes in proptest::collection::vec(0u8..=255, 0..80)) {
            let c = ConnectorProof::new(token(1), [2; NONCE_BYTES]);
            let _ = c.on_answer(&bytes);
            let mut l = ListenerProof::new(token(1), [3; NONCE_BYTES]);
            let _ = l.on_hello(&bytes);
            let _ = l.on_confirm(&bytes);
        }
    }
}
