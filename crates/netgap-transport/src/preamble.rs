//! The one seam where every data connection, of every transport, proves it
//! belongs to its session before payload moves: the three messages of
//! [`netgap_proto::dataproof`] exchanged over the fresh [`Flow`] right
//! after connect or accept, before any test or role starts and before any
//! clock runs, so the measured data path is untouched.
//!
//! The connecting end ([`connector`]) sends a nonce and sends nothing more
//! unless the far end answers with a tag only a holder of the point's
//! [`DataToken`] can make; the listening end ([`listener`]) starts its role
//! only once the connector proved the token too. Each end then hands the
//! flow the connection's key ([`Flow::bind_session`]): the connector
//! before its confirmation goes, the listener once it checked it, so a
//! transport that authenticates its own frames (xdp) does so from the
//! confirmation on. The point-to-point runner,
//! the agent's server role and the bandwidth roles of multi-host workloads
//! all go through here.

use crate::{Flow, FlowError};
use netgap_proto::dataproof::{
    ConnectorProof, DataProofError, DataToken, ListenerProof, ANSWER_BYTES, CONFIRM_BYTES,
    HELLO_BYTES, NONCE_BYTES, TOKEN_BYTES,
};

/// Why a data connection was refused before its payload.
#[derive(Debug, thiserror::Error)]
pub enum PreambleError {
    /// The far end is not a netgap end of this point.
    #[error("{0}; no payload was sent")]
    Proof(#[from] DataProofError),
    /// The far end went silent or closed during the proof (a plain sink
    /// says nothing back).
    #[error("the far end did not prove it belongs to this session ({0}); no payload was sent")]
    Flow(#[from] FlowError),
    /// No random bytes for a nonce.
    #[error("no random bytes for a nonce: {0}")]
    Random(std::io::Error),
}

fn nonce() -> Result<[u8; NONCE_BYTES], PreambleError> {
    let mut n = [0u8; NONCE_BYTES];
    crate::random::fill_random(&mut n).map_err(PreambleError::Random)?;
    Ok(n)
}

/// A fresh token for one point, drawn by the coordinator.
pub fn new_token() -> Result<DataToken, PreambleError> {
    let mut t = [0u8; TOKEN_BYTES];
    crate::random::fill_random(&mut t).map_err(PreambleError::Random)?;
    Ok(DataToken::from_bytes(t))
}

/// The connecting end: proves `token` with the far end of `flow`, and
/// returns only once the far end proved it holds it too. Waits at most the
/// flow's I/O timeout for each answer.
pub fn connector(flow: &mut dyn Flow, token: &DataToken) -> Result<(), PreambleError> {
    let proof = ConnectorProof::new(token.clone(), nonce()?);
    let (tx, rx) = flow.split();
    tx.send_all(&proof.hello())?;
    tx.end_burst()?;
    let mut answer = [0u8; ANSWER_BYTES];
    rx.recv_exact(&mut answer)?;
    let confirm = proof.on_answer(&answer)?;
    flow.bind_session(&proof.flow_key(&answer)?)?;
    let tx = flow.split().0;
    tx.send_all(&confirm)?;
    tx.end_burst()?;
    Ok(())
}

/// The listening end: checks that the connector of `flow` holds `token`,
/// proving it holds it too. Waits at most the flow's I/O timeout for each
/// message.
pub fn listener(flow: &mut dyn Flow, token: &DataToken) -> Result<(), PreambleError> {
    let mut proof = ListenerProof::new(token.clone(), nonce()?);
    let (tx, rx) = flow.split();
    let mut hello = [0u8; HELLO_BYTES];
    rx.recv_exact(&mut hello)?;
    let answer = proof.on_hello(&hello)?;
    tx.send_all(&answer)?;
    tx.end_burst()?;
    let mut confirm = [0u8; CONFIRM_BYTES];
    rx.recv_exact(&mut confirm)?;
    proof.on_confirm(&confirm)?;
    flow.bind_session(&proof.flow_key(&confirm)?)?;
    Ok(())
}
