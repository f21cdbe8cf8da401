//! The one handshake every coordinator opens an agent session with:
//! connect to its control address, prove the shared key when there is one
//! ([`crate::auth::prove`]), then `Hello` and `Welcome`.

use crate::control::{control_detail, Connect, ControlAddr, ControlConn, ControlError};
use netgap_core::host::HostFacts;
use netgap_proto::auth::{is_auth_frame, Key};
use netgap_proto::codec::{decode_reply, CodecError};
use netgap_proto::session::{CoordinatorSession, SessionError};
use std::io;
use std::net::IpAddr;
use std::time::Duration;

/// How long a coordinator waits for an agent's TCP handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the handshake waits for each of the agent's answers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A control session with an agent, after the handshake: the connection, the
/// coordinator's session machine, and what the agent said of its host.
pub struct AgentLink {
    /// The control connection.
    pub conn: ControlConn,
    /// The coordinator's side of the session, past `Welcome`.
    pub session: CoordinatorSession,
    /// Facts of the agent's host, from its `Welcome`.
    pub peer_host: HostFacts,
    /// This end's IP address on the connection; `None` over a Unix socket.
    pub local_ip: Option<IpAddr>,
    /// The agent's IP address on the connection; `None` over a Unix socket.
    pub agent_ip: Option<IpAddr>,
}

/// Why the handshake with an agent failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The agent could not be reached.
    #[error("cannot connect: {0} (is `netgap serve` running there?)")]
    Connect(#[source] io::Error),
    /// The key proof failed.
    #[error("authentication: {0}")]
    Auth(#[from] crate::auth::HandshakeError),
    /// The agent wants a key and none was given.
    #[error("{}", crate::auth::KEY_REQUIRED)]
    KeyRequired,
    /// The control connection failed or closed.
    #[error("{}", control_detail(.0))]
    Control(#[from] ControlError),
    /// The agent's answer does not decode.
    #[error("bad reply from agent: {0}")]
    BadReply(#[source] CodecError),
    /// The agent's answer is out of order or out of range.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// Attempts at a handshake whose connection the agent closed before any
/// answer: an agent flooded by strangers closes its oldest unproven
/// connections, and a retry gets a fresh place.
const ATTEMPTS: usize = 3;

/// Connects to the agent at `addr`, proves `key` when given (see
/// [`crate::auth::prove`]) and shakes hands: the one handshake every
/// coordinator uses.
pub fn handshake(addr: &ControlAddr, key: Option<&Key>) -> Result<AgentLink, LinkError> {
    let mut attempt = 1;
    let started = std::time::Instant::now();
    loop {
        match handshake_once(addr, key) {
            Err(e) if attempt < ATTEMPTS && closed_before_any_answer(&e) => attempt += 1,
            Err(LinkError::Session(SessionError::Busy)) if started.elapsed() < BUSY_GRACE => {
                std::thread::sleep(BUSY_RETRY);
            }
            done => return done,
        }
    }
}

/// How long a coordinator keeps asking an agent that says it is busy: an
/// agent frees itself only once every thread of the session before has
/// ended, a moment after that session's coordinator saw its last reply,
/// so a run started right after another on the same agent waits this out;
/// an agent busy with someone else's run is still named after it.
const BUSY_GRACE: Duration = Duration::from_secs(3);
/// The pause between two handshakes with a busy agent.
const BUSY_RETRY: Duration = Duration::from_millis(50);

/// Whether the agent closed the connection before answering anything
/// (its answer would have been an error line or a welcome).
fn closed_before_any_answer(e: &LinkError) -> bool {
    matches!(
        e,
        LinkError::Control(ControlError::Closed)
            | LinkError::Auth(crate::auth::HandshakeError::Control(ControlError::Closed))
    )
}

fn handshake_once(addr: &ControlAddr, key: Option<&Key>) -> Result<AgentLink, LinkError> {
    let stream = addr.connect(CONNECT_TIMEOUT).map_err(LinkError::Connect)?;
    let local_ip = stream.local_ip();
    let agent_ip = stream.peer_ip();
    let mut conn = ControlConn::new(stream).map_err(ControlError::Io)?;
    if let Some(key) = key {
        crate::auth::prove(&mut conn, key, HANDSHAKE_TIMEOUT)?;
    }
    let mut session = CoordinatorSession::new();
    conn.send(&session.hello())?;
    let payload = conn.recv_payload(HANDSHAKE_TIMEOUT)?;
    if is_auth_frame(&payload) {
        return Err(LinkError::KeyRequired);
    }
    let reply = decode_reply(&payload).map_err(LinkError::BadReply)?;
    let peer_host = session.on_welcome(reply)?;
    Ok(AgentLink {
        conn,
        session,
        peer_host,
        local_ip,
        agent_ip,
    })
}
