//! How a session ends: why it ended early, and the claim on the agent that
//! its last thread gives back; below the session and the workload roles,
//! which both hold them.

use super::Shared;
use crate::control::ControlError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionEnd {
    #[error("{0}")]
    Control(#[from] ControlError),
    #[error("{0}")]
    Refused(String),
    /// Ended before the peer proved the key (or, keyless, said hello).
    #[error("{0}")]
    Unproven(Box<SessionEnd>),
}

/// Releases the busy flag when the session that claimed it and every role
/// thread it started have ended: the next session starts only once nothing
/// of this one runs.
pub(crate) struct BusyClaim(pub(super) Arc<Shared>);

impl Drop for BusyClaim {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}
