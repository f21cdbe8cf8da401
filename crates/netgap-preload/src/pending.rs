//! An accepted connection whose first bytes have not been seen yet: where
//! it stands (a hello from this host or another, or left to the kernel),
//! its ends and its blocking mode. `setup` resolves it; the descriptor
//! table holds it meanwhile.

use crate::diag::Ends;
use std::sync::Mutex;

/// Where an accepted connection stands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pend {
    /// A peer on this host: a whole hello first is taken.
    Local,
    /// A peer on another host (`-t xdp`): a whole relay hello first is
    /// taken.
    Remote,
    /// Left on the kernel's TCP before the peer said anything (the program
    /// wrote first): a hello that comes first after all, from a connector
    /// that raced, is dropped unanswered.
    Watch {
        /// The peer is on another host (a relay hello is dropped, else a
        /// same-host one).
        remote: bool,
    },
}

/// An accepted connection not yet resolved.
pub(crate) struct Pending {
    pub(crate) nonblocking: std::sync::atomic::AtomicBool,
    /// The stage; the lock serialises resolution between threads.
    pub(crate) stage: Mutex<Pend>,
    /// The connection's two ends (this one first).
    pub(crate) ends: Ends,
}

impl Pending {
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn nonblocking(&self) -> bool {
        self.nonblocking.load(std::sync::atomic::Ordering::Relaxed)
    }
}
