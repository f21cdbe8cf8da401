//! An accepted connection whose first bytes have not been seen yet: where
//! it stands (a hello from this host or another, or left to the kernel),
//! its ends and its blocking mode, and (with the `xdp` feature) its direct
//! request while the grant is awaited. `setup` resolves it; the
//! descriptor table holds it meanwhile.

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
    /// The relay hello answered and a direct connection asked of this
    /// host's relay: its grant or refusal comes on the request's socket
    /// ([`Pending::granting`]), which the program's waits watch in the
    /// connection's place.
    #[cfg(feature = "xdp")]
    Granting,
}

/// The kernel's share of an epoll registration `events` of an accepted
/// connection whose grant is awaited (`Pend::Granting`): all but
/// writability. The kernel calls the socket writable at once, but no
/// write proceeds before the grant or the refusal (a non-blocking one says
/// `EAGAIN`), so a program waiting to write would be woken for nothing,
/// at once and again (level-triggered) or once and never after
/// (edge-triggered). The request's socket beside the connection wakes the
/// wait when the answer comes, and the program's whole interest goes back
/// to the kernel then (`setup::grant`), which reports writability as it
/// is.
#[cfg(feature = "xdp")]
pub(crate) fn held_events(events: u32) -> u32 {
    events & !((libc::EPOLLOUT | libc::EPOLLWRNORM | libc::EPOLLWRBAND) as u32)
}

/// An accepted connection's direct request while its grant is awaited.
#[cfg(feature = "xdp")]
pub(crate) struct Granting {
    /// The request, on its socket to the relay.
    pub(crate) asked: crate::direct::Asked,
    /// The relayed listen, the connection's path if the relay refuses:
    /// its ring and its socket to the relay.
    pub(crate) ch: crate::channel::Channel,
    pub(crate) bell: std::os::fd::OwnedFd,
    /// This process's forks when the request was made (`pid::forks`):
    /// after another, a child may hold the connection too.
    pub(crate) forks: u32,
}

/// An accepted connection not yet resolved.
pub(crate) struct Pending {
    pub(crate) nonblocking: std::sync::atomic::AtomicBool,
    /// The stage; the lock serialises resolution between threads.
    pub(crate) stage: Mutex<Pend>,
    /// The connection's two ends (this one first).
    pub(crate) ends: Ends,
    /// In the stage [`Pend::Granting`]: the direct request.
    #[cfg(feature = "xdp")]
    pub(crate) granting: Mutex<Option<Granting>>,
}

impl Pending {
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn nonblocking(&self) -> bool {
        self.nonblocking.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The socket a direct request's grant comes on while it is awaited
    /// (the connection's place in the program's waits), else -1.
    #[cfg(feature = "xdp")]
    pub(crate) fn granting_fd(&self) -> libc::c_int {
        self.granting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(-1, |g| g.asked.relay_fd())
    }
}
