//! The I/O edge of shared-key authentication: key files (loading with a
//! permission check, making new ones), fresh nonces, and running the
//! handshake of [`netgap_proto::auth`] over a [`ControlConn`] on either end.
//!
//! The coordinator calls [`prove`] right after connecting to a keyed agent,
//! before its `Hello`; the agent calls [`challenge`] on every new connection
//! when it has a key, before decoding any request.

use crate::control::{ControlConn, ControlError};
use netgap_proto::auth::NONCE_BYTES;
use netgap_proto::auth::{is_auth_frame, AgentHandshake, AuthError, CoordinatorHandshake, Key};
use netgap_proto::codec::decode_reply;
use netgap_proto::message::Reply;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes of a key made by [`new_key_file`].
pub const NEW_KEY_BYTES: usize = 32;

/// Why a key file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The file could not be read: not a regular file, past
    /// [`Cap::KEY`](netgap_core::files::Cap::KEY).
    #[error("key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: netgap_core::files::ReadError,
    },
    /// Group or others may read the file.
    #[error(
        "key file {path} is readable by group or others (mode {mode:03o}); run chmod 600 {path}"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key is too short or too long.
    #[error("key file {path}: {source} (make one with `netgap key new FILE`)")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: AuthError,
    },
}

/// Reads a key file: refused if group or others have any access to it, or if
/// it holds fewer than [`netgap_proto::auth::MIN_KEY_BYTES`] bytes. The whole file is the key.
pub fn load_key(path: &Path) -> Result<Key, KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let bytes =
        netgap_core::files::read_bytes(path, netgap_core::files::Cap::KEY).map_err(|e| {
            KeyFileError::Read {
                path: path.to_path_buf(),
                source: e,
            }
        })?;
    Key::from_bytes(bytes).map_err(|source| KeyFileError::Key {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a new random key of [`NEW_KEY_BYTES`] bytes to `path`, mode 0600;
/// refuses to overwrite an existing file.
pub fn new_key_file(path: &Path) -> Result<(), KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = [0u8; NEW_KEY_BYTES];
    netgap_transport::random::fill_random(&mut bytes).map_err(io_err)?;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err)?;
    f.write_all(&bytes).map_err(io_err)?;
    f.sync_all().map_err(io_err)
}

fn nonce() -> io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    netgap_transport::random::fill_random(&mut n)?;
    Ok(n)
}

/// Why a handshake did not complete. One line each.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other end broke the protocol or holds another key.
    #[error("{0}")]
    Auth(#[from] AuthError),
    /// The control connection failed.
    #[error("{0}")]
    Control(#[from] ControlError),
    /// The agent refused, with its reason.
    #[error("the agent refused: {0}")]
    Refused(String),
    /// The agent runs without a key but the coordinator has one.
    #[error("the agent runs without a key; run without --key, or start the agent with --key")]
    AgentHasNoKey,
    /// No random bytes for a nonce.
    #[error("no random bytes for a nonce: {0}")]
    Random(io::Error),
}

/// Coordinator side: proves `key` to the agent on `conn` and checks the
/// agent's proof, all within `timeout`. Call right after connecting.
pub fn prove(conn: &mut ControlConn, key: &Key, timeout: Duration) -> Result<(), HandshakeError> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut hs = CoordinatorHandshake::new(key.clone(), nonce().map_err(HandshakeError::Random)?);
    conn.send_payload(&hs.begin())?;
    let challenge = conn.recv_payload(left())?;
    refused_by_agent(&challenge)?;
    let response = hs.on_challenge(&challenge)?;
    conn.send_payload(&response)?;
    let proof = conn.recv_payload(left())?;
    refused_by_agent(&proof)?;
    hs.on_proof(&proof)?;
    Ok(())
}

/// A protocol reply where an auth frame belongs: the agent's refusal (or a
/// keyless agent's answer to our `Begin`).
fn refused_by_agent(payload: &[u8]) -> Result<(), HandshakeError> {
    if is_auth_frame(payload) {
        return Ok(());
    }
    match decode_reply(payload) {
        Ok(Reply::Error { message }) if message.contains(NO_KEY_MARK) => {
            Err(HandshakeError::AgentHasNoKey)
        }
        Ok(Reply::Error { message }) => Err(HandshakeError::Refused(message)),
        _ => Err(HandshakeError::AgentHasNoKey),
    }
}

/// Words a keyless agent's refusal of an auth frame contains.
pub(crate) const NO_KEY_MARK: &str = "this agent runs without a key";

/// The message a keyless agent sends when a coordinator starts the handshake.
pub(crate) fn no_key_message() -> String {
    format!("{NO_KEY_MARK}; run the coordinator without --key")
}

/// The answer to a second key proof on a connection that already proved
/// the key.
pub(crate) const ALREADY_PROVEN: &str =
    "the key is already proven on this connection; the next message must be hello";

/// The message a keyless coordinator shows when a keyed agent challenges it.
pub(crate) const KEY_REQUIRED: &str =
    "the agent requires a shared key: pass --key FILE with the agent's key";

/// Agent side: challenges the coordinator on `conn` with `key`, waiting at
/// most until `deadline`; `started` is called once the coordinator's first
/// frame parses (it has begun the proof). Nothing the peer sends is decoded
/// as a request. On failure, the coordinator gets one error reply (best
/// effort).
pub fn challenge(
    conn: &mut ControlConn,
    key: &Key,
    deadline: Instant,
    started: &dyn Fn(),
) -> Result<(), HandshakeError> {
    let mut hs = AgentHandshake::new(key.clone(), nonce().map_err(HandshakeError::Random)?);
    conn.send_payload(&hs.challenge())?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ControlError::TimedOut(Duration::ZERO).into());
        }
        let payload = conn.recv_or_tell(left)?;
        match hs.on_frame(&payload) {
            Ok(None) => started(),
            Ok(Some(proof)) => {
                conn.send_payload(&proof)?;
                return Ok(());
            }
            Err(e) => {
                let message = match &e {
                    AuthError::NotAuth => KEY_REQUIRED.to_string(),
                    other => other.to_string(),
                };
                let _ = conn.send(&Reply::Error { message });
                return Err(e.into());
            }
        }
    }
}
