//! A connector's offer on its connection: what it holds until the
//! listener's answer (`Offer`, `OfferPath`), and how the connection
//! leaves it (accepted, refused with the ring's bytes given back to the
//! kernel socket, dropped, or gone direct).

use super::{set_tcp_flag, Conn};
use crate::channel::{Channel, Corrupt, Role};
use crate::errno::Errno;
use crate::log::log_line;
use crate::real;
use libc::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use thiserror::Error;

/// Why the bytes a connector wrote before a refused offer did not go out
/// on the kernel socket.
#[derive(Debug, Error)]
pub(crate) enum GiveBackError {
    /// The ring they sat in was corrupt.
    #[error("the ring was corrupt")]
    Corrupt,
    /// The kernel socket did not take them.
    #[error("sending the {bytes} bytes written before the answer: {why}")]
    Send {
        /// How many bytes were to go.
        bytes: usize,
        /// The socket's error.
        why: std::io::Error,
    },
}

impl Conn {
    /// A connector's connection whose hello went out and whose answers
    /// are still to come (see [`Conn::offered`]).
    /// `port` names the destination in the log; `path` holds what the
    /// answer's data path needs.
    pub(crate) fn new_offered(
        fd: c_int,
        channel: Channel,
        nonblocking: bool,
        (port, path): (u16, OfferPath),
        region_fd: c_int,
    ) -> Conn {
        let mut c = Conn::new(fd, channel, Role::Connector, nonblocking, region_fd);
        if matches!(path, OfferPath::Relay(_)) {
            c.offer_end = crate::unix::eventfd().ok();
        }
        c.offered.store(true, Ordering::SeqCst);
        *c.offer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Offer {
            port,
            path,
            fd,
            shut: None,
        });
        c
    }

    /// The descriptor a wait in poll or select watches beside a relayed
    /// offer's kernel socket: readable once the offer ended, whichever
    /// thread ended it (-1: none, see `Conn::offer_end`).
    pub(crate) fn offer_end_fd(&self) -> c_int {
        self.offer_end.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Marks the offer ended and wakes a wait watching
    /// [`Conn::offer_end_fd`].
    fn end_offer(&self) {
        self.offered.store(false, Ordering::SeqCst);
        if let Some(f) = &self.offer_end {
            let one = 1u64.to_ne_bytes();
            // SAFETY: an 8-byte buffer on the stack written to the
            // connection's own eventfd; its counter only grows, so the
            // descriptor stays readable for any later wait too.
            unsafe { libc::write(f.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Whether the listener's answer is still to be read.
    pub(crate) fn offered(&self) -> bool {
        self.offered.load(Ordering::Acquire)
    }

    /// Holds the offer's lock: `Some` while an answer is still to be
    /// read; the caller reads it, sets the offer to None once it ends, and
    /// ends it with [`Conn::offer_accepted`], [`Conn::offer_refused`] or
    /// [`Conn::offer_dropped`].
    pub(crate) fn offer_lock(&self) -> std::sync::MutexGuard<'_, Option<Offer>> {
        self.offer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the connection is offered through the relays (the relay
    /// must take the bytes in the ring before the connection's end, so a
    /// close or shutdown leaves the offer's end to a thread of the
    /// library's: `setup::close_offered`, `setup::shut_offered`).
    pub(crate) fn offered_via_relay(&self) -> bool {
        self.offered()
            && matches!(
                self.offer_lock().as_ref().map(|o| &o.path),
                Some(OfferPath::Relay(_))
            )
    }

    /// The descriptor the offer's answer is read on (see [`Offer::fd`]),
    /// or None once the offer ended.
    pub(crate) fn offer_fd(&self) -> Option<c_int> {
        self.offer_lock().as_ref().map(|o| o.fd)
    }

    /// The program closes its descriptor `fd` of this offered connection
    /// (`other`: another descriptor of the program that stays open): the
    /// offer is read on that one from now on, or, at the program's last
    /// descriptor, on a duplicate of the socket of the library's own, so
    /// that the program's descriptor number is free at once.
    pub(crate) fn offer_outlives(&self, fd: c_int, other: Option<c_int>) -> OfferOnClose {
        let mut guard = self.offer_lock();
        let Some(offer) = guard.as_mut() else {
            return OfferOnClose::Ended;
        };
        if let Some(other) = other {
            if offer.fd == fd {
                offer.fd = other;
            }
            return OfferOnClose::Kept;
        }
        // SAFETY: a plain fcntl on the program's open descriptor (its
        // close waits for this call).
        let keep = unsafe { real::fcntl()(offer.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if keep < 0 {
            return OfferOnClose::NoDuplicate;
        }
        // SAFETY: the duplicate just made, owned from here on.
        let keep = crate::unix::lift(unsafe { OwnedFd::from_raw_fd(keep) });
        offer.fd = keep.as_raw_fd();
        self.orphaned.store(true, Ordering::SeqCst);
        OfferOnClose::Orphaned(keep)
    }

    /// The program shut down this offered connection (`how`): the
    /// library's side of it at once ([`Conn::shut`]), the kernel socket's
    /// once the offer ends ([`Conn::apply_deferred_shutdown`]), after the
    /// bytes in the ring went to the relay or the kernel socket. False:
    /// the offer had ended (the shutdown goes the usual way).
    pub(crate) fn defer_shutdown(&self, how: c_int) -> bool {
        let mut guard = self.offer_lock();
        let Some(offer) = guard.as_mut() else {
            return false;
        };
        offer.shut = Some(match (offer.shut, how) {
            (None, h) => h,
            (Some(a), b) if a == b => a,
            _ => libc::SHUT_RDWR,
        });
        drop(guard);
        self.shut(how);
        true
    }

    /// The shutdown a program made while the connection was offered,
    /// applied to the kernel socket `fd` (or the direct connection) now
    /// that the offer ended with `shut` taken from it.
    pub(crate) fn apply_deferred_shutdown(&self, fd: c_int, shut: Option<c_int>) {
        let Some(how) = shut else {
            return;
        };
        #[cfg(feature = "xdp")]
        if let Some(d) = self.went_direct() {
            d.shut(how);
            return;
        }
        let bell = self.bell();
        if bell >= 0 && !self.given_back.load(Ordering::SeqCst) {
            // Taken by the relay: the end is the ring's mark, which the
            // program's shutdown set (`Conn::shut`) and the relay carries
            // after the ring's bytes; the kernel's FIN would overtake
            // them. Only a receiving side shut down goes to the kernel.
            if how != libc::SHUT_WR {
                // SAFETY: a plain shutdown of the connection's socket.
                unsafe { real::shutdown()(fd, libc::SHUT_RD) };
            }
            if how != libc::SHUT_RD {
                self.ring_on(bell);
            }
            return;
        }
        // SAFETY: a plain shutdown of the connection's socket.
        unsafe { real::shutdown()(fd, how) };
    }

    /// Ends this connection, whose program closed its last descriptor
    /// while it was offered, now that the offer ended: on `fd`, the
    /// library's own descriptor of its socket (which the caller then
    /// closes), as the program's close would have ended it had the answer
    /// been in. A connection given back to the kernel's TCP needs nothing
    /// more; a direct one logs its close and ends with this connection.
    pub(crate) fn close_orphan(&self, fd: c_int) {
        #[cfg(feature = "xdp")]
        if let Some(d) = self.went_direct() {
            d.closing(fd);
            return;
        }
        if self.given_back.load(Ordering::SeqCst) {
            return;
        }
        self.log_close(fd);
        self.last_close(fd);
    }

    /// The relay took the connection, reached on `bell` (which the
    /// connection now owns): set before the offer ends, so the first
    /// doorbell goes to the relay.
    pub(crate) fn set_bell(&self, bell: c_int) {
        self.bell.store(bell, Ordering::SeqCst);
    }

    /// Sends the offer's `hello` on the kernel socket `fd` (to `port`,
    /// for the log). Err: it did not go out whole, so the byte stream is
    /// no longer the program's: the offer is dropped and the socket shut
    /// down, and `connect` fails with that errno rather than carry
    /// corrupt data.
    pub(crate) fn send_hello(&self, fd: c_int, port: u16, hello: &[u8]) -> Result<(), Errno> {
        let Err(err) = crate::exchange::send_all(fd, hello) else {
            return Ok(());
        };
        log_line!(
            "fd {fd}: connection to port {port} fails (ECONNRESET): sending the hello: {}",
            std::io::Error::from_raw_os_error(err)
        );
        self.offer_dropped();
        // SAFETY: a plain shutdown of the program's socket; `shutdown` is
        // interposed, so the real one is called.
        unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
        Err(libc::ECONNRESET)
    }

    /// The offer broke: the connection is shut down, nothing is sent.
    pub(crate) fn offer_dropped(&self) {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.end_offer();
        self.given_back.store(true, Ordering::SeqCst);
    }

    /// The listener took the channel (or, relayed, the relay took the
    /// connection): bytes the program wrote meanwhile are in the ring, and
    /// one doorbell makes sure a reader already waiting for them is woken.
    pub(crate) fn offer_accepted(&self, fd: c_int) {
        self.end_offer();
        // A writer publishes, then checks `offered` (both SeqCst): either
        // it saw the offer over and rang itself, or its bytes are seen
        // here.
        if self.channel.unsent().map_or(true, |n| n > 0) {
            self.ring(fd);
        }
    }

    /// The listener refused the channel: what the program wrote into the
    /// ring meanwhile is sent over the kernel socket (where the listener's
    /// program will read it), and the kernel socket's TCP options are the
    /// program's again. Err: the bytes could not be sent.
    pub(crate) fn offer_refused(&self, fd: c_int) -> Result<(), GiveBackError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.end_offer();
        set_tcp_flag(fd, libc::TCP_NODELAY, self.nodelay.load(Ordering::Relaxed));
        set_tcp_flag(fd, libc::TCP_CORK, self.cork.load(Ordering::Relaxed));
        // Whatever happens to the ring's bytes, later writes are the
        // kernel socket's: on a failure it is shut down.
        self.given_back.store(true, Ordering::SeqCst);
        let bytes = self
            .channel
            .take_unsent()
            .map_err(|Corrupt| GiveBackError::Corrupt)?;
        if bytes.is_empty() {
            return Ok(());
        }
        crate::exchange::send_all(fd, &bytes).map_err(|e| GiveBackError::Send {
            bytes: bytes.len(),
            why: std::io::Error::from_raw_os_error(e),
        })
    }

    /// The relays gave the connection the direct path `d`: the offer
    /// ends, what the program wrote into the ring meanwhile goes out first
    /// on `d`, and from then on every write on this connection is `d`'s
    /// ([`Sent::Direct`]). All of it under the writers' lock, so a writer
    /// racing the switch either put its bytes in the ring before (they go
    /// out here) or finds the switch made (it sends after them). Err: the
    /// ring's bytes did not go out.
    #[cfg(feature = "xdp")]
    pub(crate) fn offer_went_direct(
        &self,
        d: &std::sync::Arc<crate::direct::Direct>,
    ) -> Result<(), GiveBackError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Before the offer ends: a reader that sees it ended finds the
        // direct connection (`Conn::went_direct`), not the ring.
        let _ = self.direct.set(d.clone());
        self.end_offer();
        let bytes = self
            .channel
            .take_unsent()
            .map_err(|Corrupt| GiveBackError::Corrupt)?;
        // A program that closed the connection waits for nothing: its
        // bytes get the time a close's linger gives an opening, and a peer
        // that never answers is told with a reset, not waited on until
        // the silence limit (the process's exit waits for this thread).
        let by = self
            .orphaned
            .load(Ordering::SeqCst)
            .then(|| std::time::Instant::now() + netgap_transport::xdp::direct::OPENING_LINGER);
        d.send_first(&bytes, by).map_err(|e| GiveBackError::Send {
            bytes: bytes.len(),
            why: std::io::Error::from_raw_os_error(e),
        })
    }

    /// The direct connection this offered connection went to, if it did.
    #[cfg(feature = "xdp")]
    pub(crate) fn went_direct(&self) -> Option<std::sync::Arc<crate::direct::Direct>> {
        self.direct.get().cloned()
    }
}

/// A connector's offer: the destination port (for the log) and what its
/// data path needs once the listener answers.
pub(crate) struct Offer {
    pub(crate) port: u16,
    pub(crate) path: OfferPath,
    /// The descriptor the answer is read on: the program's, or once the
    /// program closed the one it connected, another of its descriptors
    /// of the connection or a duplicate the library owns
    /// ([`Conn::offer_outlives`]).
    pub(crate) fd: c_int,
    /// A shutdown the program made while offered, for the kernel socket
    /// once the offer ends ([`Conn::defer_shutdown`]).
    pub(crate) shut: Option<c_int>,
}

/// What the program's close of a descriptor leaves of an offer.
pub(crate) enum OfferOnClose {
    /// It had ended: the close goes the usual way.
    Ended,
    /// Another of the program's descriptors holds the connection, and the
    /// offer is read there.
    Kept,
    /// That was the program's last descriptor: the offer is read on this
    /// duplicate of the socket (close-on-exec), which the caller ends and
    /// closes.
    Orphaned(OwnedFd),
    /// No duplicate could be made (the descriptor table is full).
    NoDuplicate,
}

/// The data path a connector offered in its hello.
pub(crate) enum OfferPath {
    /// A listener on this host: the connection's mailbox, which the
    /// listener reads the connector's credentials from (closed with the
    /// offer).
    Shm {
        mailbox: Option<std::os::fd::OwnedFd>,
    },
    /// A listener on another host, through the relays.
    Relay(RelayOffer),
}

/// What a relayed connector's offer holds for its relay's connect
/// request, made once the listener answers: the host's relay held for
/// the connection (its socket, closed with the offer unless the
/// connection takes it as its bell), the flow key the hello carried, and
/// the region the ring lives in, which the request hands to the relay.
pub(crate) struct RelayOffer {
    pub(crate) key: [u8; netgap_proto::preload::RELAY_KEY_BYTES],
    pub(crate) ring_bytes: u32,
    /// The socket to the relay; -1 once taken.
    pub(crate) sock: c_int,
    pub(crate) region: crate::region::Region,
}

impl RelayOffer {
    /// Takes the relay socket out of the offer (it is no longer closed
    /// with it).
    pub(crate) fn take_sock(&mut self) -> c_int {
        std::mem::replace(&mut self.sock, -1)
    }
}

impl Drop for RelayOffer {
    fn drop(&mut self) {
        if self.sock >= 0 {
            // SAFETY: the relay socket this offer owns, closed once.
            unsafe { real::close()(self.sock) };
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let OfferPath::Shm { mailbox } = &mut self.path {
            if let Some(m) = mailbox.take() {
                crate::unix::close(m);
            }
        }
    }
}

#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable now.
    fn readable(fd: c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn offered(path: OfferPath) -> Conn {
        let (ch, region) = crate::region::make(4096).unwrap();
        let path = match path {
            OfferPath::Relay(mut r) => {
                r.region = region;
                OfferPath::Relay(r)
            }
            shm => shm,
        };
        Conn::new_offered(-1, ch, false, (7, path), -1)
    }

    #[test]
    fn a_relayed_offers_end_wakes_a_wait_on_its_eventfd_and_a_shm_offer_has_none() {
        let c = offered(OfferPath::Relay(RelayOffer {
            key: [1; netgap_proto::preload::RELAY_KEY_BYTES],
            ring_bytes: 4096,
            sock: -1,
            region: crate::region::Region(-1),
        }));
        let end = c.offer_end_fd();
        assert!(end >= 0);
        assert!(!readable(end));
        c.offer_dropped();
        assert!(!c.offered());
        assert!(readable(end));
        // It stays readable: a wait that begins later sees it too.
        assert!(readable(end));
        let shm = offered(OfferPath::Shm { mailbox: None });
        assert_eq!(shm.offer_end_fd(), -1);
    }
}
