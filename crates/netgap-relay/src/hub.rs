//! The link table: the relay's links to each other host and the
//! openings under way ([`crate::table`]), and the listens waiting for the
//! other relay's `OPEN`; the two requests that use it, a listen (the
//! accepting side) and a connect, each opening a link when none serves
//! it.

use crate::host::reset_tcp;
use crate::journal::Journal;
use crate::link::{Hold, Link, Pending};
use crate::policy::{self, XdpInterface};
use crate::queues::Queues;
use crate::rendezvous::Rendezvous;
use crate::table::{LinkTable, Role, Step};
use netgap_proto::direct::{QueueAnswer, QueueOffer};
use netgap_proto::relay::{self as frame};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a request gets no place on the link table.
#[derive(Debug, Error)]
pub(crate) enum HubError {
    /// No room for another link.
    #[error(transparent)]
    Full(#[from] crate::table::Full),
    /// Another request opened or closed the link for longer than the
    /// wait.
    #[error("the link did not come up in time")]
    NotUp,
    /// A listen with the same connection key already waits.
    #[error("a connection with the same key already waits")]
    KeyTaken,
}

/// The relay's links and the listens waiting for their connection,
/// and what it was started for.
pub(crate) struct Hub {
    pub(crate) links: Mutex<LinkTable<Link>>,
    pub(crate) cv: Condvar,
    pub(crate) pending: Mutex<HashMap<[u8; frame::KEY_BYTES], Pending>>,
    pub(crate) timeout: Duration,
    /// The interface of its flows (`--interface`).
    pub(crate) iface: XdpInterface,
    /// The hosts it serves (`--peers`).
    pub(crate) served: policy::Served,
    /// The relays' key (`--key`): every link's key derives from it.
    pub(crate) relay_key: netgap_proto::auth::Key,
    pub(crate) journal: Arc<Journal>,
    /// Direct connections' setup (None: `--no-direct`).
    pub(crate) direct: Option<DirectHub>,
}

/// What reaches a direct request waiting for its other half.
pub(crate) enum Event {
    /// The other relay's offer, on its link (the accepting side).
    Offer(Parked),
    /// The other relay's answer to this side's offer.
    Answer(QueueAnswer),
}

/// A waiting direct request's mailbox.
pub(crate) type Mailbox = std::sync::mpsc::SyncSender<Event>;

/// The other relay's offer with the link it came on, held while it
/// waits.
pub(crate) struct Parked {
    pub(crate) offer: QueueOffer,
    pub(crate) link: Hold,
}

/// The direct connections' state: the requests and offers waiting for
/// their other half, and the interface's queues.
pub(crate) struct DirectHub {
    pub(crate) meet: Mutex<Rendezvous<Mailbox, Parked>>,
    pub(crate) queues: Arc<Mutex<Queues>>,
    /// Tokens naming the offers in flight in `queues`.
    pub(crate) next_token: std::sync::atomic::AtomicU64,
    /// Ports made ahead, bound to a queue at their grant.
    pub(crate) spares: Arc<crate::direct::Spares>,
}

impl DirectHub {
    pub(crate) fn meet(&self) -> MutexGuard<'_, Rendezvous<Mailbox, Parked>> {
        self.meet.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, LinkTable<Link>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link to `peer` to use for a request of `role` (Some: the first
    /// live one that `fits` it), or the caller's claim to open one
    /// (None), waiting until `deadline` while another request opens one
    /// or the host's links close.
    pub(crate) fn enter(
        &self,
        peer: IpAddr,
        role: Role,
        fits: impl Fn(&Link) -> bool,
        deadline: Instant,
    ) -> Result<Option<Arc<Link>>, HubError> {
        let mut t = self.lock();
        loop {
            match t.enter(peer, role, &fits)? {
                Step::Use(link) => return Ok(Some(link)),
                Step::Open => return Ok(None),
                Step::Wait => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(HubError::NotUp);
                    }
                    t = self
                        .cv
                        .wait_timeout(t, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// A link to `peer` is up; Some: the link of the host's two that
    /// listens no longer name (or never named), which carries what was
    /// opened on it until it closes.
    pub(crate) fn up(&self, peer: IpAddr, link: Arc<Link>) -> Option<Arc<Link>> {
        let aside = self.lock().up(peer, link);
        self.cv.notify_all();
        aside
    }

    /// The caller's claim of `role` on `peer` is given back: opening its
    /// link failed, or another link serves it.
    pub(crate) fn forget(&self, peer: IpAddr, role: Role) {
        self.lock().forget(peer, role);
        self.cv.notify_all();
    }

    /// `link`'s threads ended: it leaves `peer`'s entry.
    pub(crate) fn gone(&self, peer: IpAddr, link: &Arc<Link>) {
        self.lock().gone(peer, link);
        self.cv.notify_all();
    }

    /// Closes the links to `peer` that do not `fit` a connect, carry
    /// nothing and are settled: the other relay listens at a new end, so
    /// it lost them.
    pub(crate) fn close_stale(&self, peer: IpAddr, fits: impl Fn(&Link) -> bool) {
        let others = self.lock().others(peer, fits);
        for l in others {
            if l.idle() && crate::table::LinkState::settled(&*l) {
                l.shut("the other relay listens anew: the link is stale");
            }
        }
    }

    /// Whether a listen's connection still waits for its `OPEN` (false:
    /// one took it, on whichever link).
    pub(crate) fn waiting(&self, key: &[u8; frame::KEY_BYTES]) -> bool {
        self.pending().contains_key(key)
    }

    pub(crate) fn pending(&self) -> MutexGuard<'_, HashMap<[u8; frame::KEY_BYTES], Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a listen's connection until the `OPEN` with its key.
    pub(crate) fn register(&self, key: [u8; frame::KEY_BYTES], p: Pending) -> Result<(), HubError> {
        let mut m = self.pending();
        if m.contains_key(&key) {
            return Err(HubError::KeyTaken);
        }
        m.insert(key, p);
        Ok(())
    }

    /// Ends the listen waiting with `key`, if no `OPEN` took it, without
    /// touching its TCP connection: the connection went direct (the
    /// accepting side's grant is handed over), so no `OPEN` will come,
    /// and the listen no longer holds its place in the relay's
    /// connections for its whole wait.
    pub(crate) fn went_direct(&self, key: &[u8; frame::KEY_BYTES]) {
        if let Some(p) = self.pending().remove(key) {
            let _ = p.give.try_send(None);
        }
    }

    /// Gives up a listen's connection if no `OPEN` took it: its TCP
    /// connection is reset (the program waits on its ring otherwise).
    /// False: an `OPEN` took it first.
    pub(crate) fn abandon(&self, key: &[u8; frame::KEY_BYTES]) -> bool {
        let Some(p) = self.pending().remove(key) else {
            return false;
        };
        reset_tcp(p.ends.tcp.as_raw_fd());
        p.ends.ring.closing();
        true
    }
}
