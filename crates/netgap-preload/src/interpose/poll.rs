//! The readiness calls `poll` and `ppoll`, and what `select` and epoll
//! (`select.rs`, `epoll.rs`) share with them. A taken-over connection is
//! ready by its ring; the kernel socket under it carries only its
//! doorbells, which wake a wait that sleeps in the kernel.

use crate::conn::{spin_until, Conn};
use crate::pending::Pending;
use crate::real;
use crate::setup::{self, Resolved};
use crate::table::{self, Entry};
use libc::{c_int, nfds_t, pollfd};
use std::sync::Arc;

/// Whether a taken-over connection the kernel calls readable really is
/// (see `Conn::settle`); a connector's offer is ended first if the answer
/// is in.
pub(super) fn settle(fd: c_int, c: &Arc<Conn>) -> bool {
    // The offer read before the direct connection, as `interpose::route`
    // reads them.
    let offered = c.offered();
    #[cfg(feature = "xdp")]
    if let Some(d) = c.went_direct() {
        return direct_readable(&d);
    }
    if !offered {
        return c.settle(fd);
    }
    match setup::finish_offer(fd, c, false) {
        Resolved::Shm(c) => c.settle(fd),
        // The program's own bytes (or the end) on the kernel socket.
        Resolved::Kernel => true,
        #[cfg(feature = "xdp")]
        Resolved::Direct(d) => direct_readable(&d),
        Resolved::NotYet => false,
    }
}

/// Whether a connection that went direct has bytes (or its end) for a
/// read now. The wait was woken by its kernel socket (the listener's
/// answer), not by the request's reply: a program told it is readable
/// reads, and wrk takes that read's EAGAIN for an error and reconnects.
#[cfg(feature = "xdp")]
fn direct_readable(d: &crate::direct::Direct) -> bool {
    d.poll_events(libc::POLLIN) & libc::POLLIN != 0
}

/// Whether an accepted connection still pending that the kernel calls
/// readable really is: the exchange's records are taken first, and only
/// the program's own bytes (or its connection's end on shm) count.
pub(super) fn settle_pending(fd: c_int, p: &Arc<Pending>) -> bool {
    match setup::resolve(fd, p, false, true) {
        Resolved::Shm(c) => settle(fd, &c),
        Resolved::Kernel => true,
        #[cfg(feature = "xdp")]
        Resolved::Direct(_) => true,
        Resolved::NotYet => false,
    }
}

/// Milliseconds left of a poll-style timeout (negative: forever).
pub(super) fn left_ms(timeout: c_int, start: std::time::Instant) -> c_int {
    if timeout < 0 {
        return timeout;
    }
    let spent = c_int::try_from(start.elapsed().as_millis()).unwrap_or(c_int::MAX);
    (timeout - spent).max(0)
}

/// `poll(2)`: a taken-over connection with data in its ring is readable
/// whatever the kernel socket says, and one whose socket holds only
/// doorbells is not; before sleeping, each announces the wait so its
/// peer's next write sends a doorbell.
///
/// # Safety
///
/// As for the C library's `poll`.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the program's own arguments; `wait` is the real poll on them.
    unsafe { shm_poll(fds, nfds, timeout, |f, n, t| real::poll()(f, n, t)) }
}

/// `ppoll(2)`: as [`poll`], the signal mask passed on.
///
/// # Safety
///
/// As for the C library's `ppoll`.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: a non-null timeout is valid for reads (ppoll's contract).
        let t = unsafe { *timeout };
        let ms = t
            .tv_sec
            .saturating_mul(1000)
            .saturating_add(t.tv_nsec.div_euclid(1_000_000));
        c_int::try_from(ms.max(0)).unwrap_or(c_int::MAX)
    };
    // SAFETY: the program's own arguments; `wait` is the real ppoll on
    // them with a timeout of `t` ms.
    unsafe {
        shm_poll(fds, nfds, ms, |f, n, t| {
            if t < 0 {
                real::ppoll()(f, n, std::ptr::null(), sigmask)
            } else if t == ms && !timeout.is_null() {
                real::ppoll()(f, n, timeout, sigmask)
            } else {
                let ts = libc::timespec {
                    tv_sec: (t / 1000).into(),
                    tv_nsec: libc::c_long::from(t % 1000) * 1_000_000,
                };
                real::ppoll()(f, n, &ts, sigmask)
            }
        })
    }
}

/// The shared body of `poll` and `ppoll`: `wait(set, len, timeout_ms)` is
/// the real call.
///
/// A relayed connection's socket to its relay is watched beside the
/// connection (the set passed on is the program's with those sockets
/// after it), so its relay wakes the wait with a byte on it, on this host,
/// as for epoll, instead of asking the other host's relay for a doorbell
/// on the TCP connection.
///
/// # Safety
///
/// `fds` null or valid for `nfds` entries.
unsafe fn shm_poll(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    wait: impl Fn(*mut pollfd, nfds_t, c_int) -> c_int,
) -> c_int {
    if fds.is_null() || nfds == 0 {
        return wait(fds, nfds, timeout);
    }
    let start = std::time::Instant::now();
    loop {
        let left = left_ms(timeout, start);
        #[cfg(feature = "xdp")]
        {
            // SAFETY: poll's contract: `fds` holds `nfds` valid entries.
            let set = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
            let direct = super::poll_direct::direct_watched(set);
            if !direct.is_empty() {
                // SAFETY: as above.
                match unsafe { super::poll_direct::direct_poll(fds, nfds, left, &wait, &direct) } {
                    Polled::Done(n) => return n,
                    Polled::Moved => continue,
                }
            }
        }
        // SAFETY: as above.
        match unsafe { rings_poll(fds, nfds, left, &wait) } {
            Polled::Done(n) => return n,
            Polled::Moved => {}
        }
    }
}

/// What one look of [`shm_poll`] found.
pub(super) enum Polled {
    /// The count of ready entries, or the real call's failure (-1).
    Done(c_int),
    /// Nothing is ready, and a relayed offer in the set ended while the
    /// wait slept (`Conn::offer_end_fd`): its connection may be on another
    /// path now (its own AF_XDP socket), so the set is looked at again
    /// with what is left of the timeout.
    Moved,
}

/// [`shm_poll`] for a set with no direct connection.
///
/// # Safety
///
/// `fds` valid for `nfds` entries.
pub(super) unsafe fn rings_poll(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    wait: impl Fn(*mut pollfd, nfds_t, c_int) -> c_int,
) -> Polled {
    // SAFETY: poll's contract: `fds` holds `nfds` valid entries.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let (shm, pend) = read_watched(set);
    if shm.is_empty() && pend.is_empty() {
        return Polled::Done(wait(fds, nfds, timeout));
    }
    // The relay sockets to watch: (the connection's place in the set, its
    // socket to the relay).
    let bells: Vec<(usize, c_int)> = shm
        .iter()
        .filter(|(_, c)| c.bell() >= 0)
        .map(|(i, c)| (*i, c.bell()))
        .collect();
    // The pending connections' direct requests' sockets, after them.
    let relayed = bells.len();
    let bells: Vec<(usize, c_int)> = bells.into_iter().chain(granting(&pend)).collect();
    // The relayed offers still open, watched by their ends' eventfds
    // after the relay sockets: the library's thread may take an answer off
    // the kernel socket before this wait sees it.
    let offers: Vec<c_int> = shm
        .iter()
        .filter(|(_, c)| c.offered())
        .map(|(_, c)| c.offer_end_fd())
        .filter(|&e| e >= 0)
        .collect();
    let mut with_bells: Vec<pollfd> = Vec::new();
    let start = std::time::Instant::now();
    let mut spun = timeout == 0;
    loop {
        if !spun && !shm.is_empty() {
            // See `Conn::recv`: watch the rings a little before sleeping.
            spun = true;
            spin_until(|| shm.iter().any(|(_, c)| c.read_ready()));
        }
        let mut ready: Vec<usize> = shm
            .iter()
            .filter(|(_, c)| c.read_ready())
            .map(|(i, _)| *i)
            .collect();
        if ready.is_empty() {
            ready = shm
                .iter()
                .filter(|(_, c)| c.arm_read_watched(c.bell() >= 0))
                .map(|(i, _)| *i)
                .collect();
        }
        let t = if ready.is_empty() {
            left_ms(timeout, start)
        } else {
            0
        };
        // The pending connections whose grant is awaited as the wait
        // begins: their writability is held back until it ends.
        let held: Vec<bool> = pend.iter().map(|(_, p)| awaits_grant(p)).collect();
        let r = if bells.is_empty() && offers.is_empty() {
            wait(fds, nfds, t)
        } else {
            // SAFETY: as above.
            let set = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
            with_bells.clear();
            with_bells.extend_from_slice(set);
            hold_writes(&mut with_bells, &pend, &held);
            with_bells.extend(
                bells
                    .iter()
                    .map(|&(_, bell)| bell)
                    .chain(offers.iter().copied())
                    .map(|fd| pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    }),
            );
            wait(with_bells.as_mut_ptr(), with_bells.len() as nfds_t, t)
        };
        if r < 0 {
            return Polled::Done(r);
        }
        // SAFETY: as above; the real poll wrote only `revents`.
        let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
        if !bells.is_empty() || !offers.is_empty() {
            copy_rung(set, &with_bells, &bells, relayed);
        }
        for (i, c) in &shm {
            if set[*i].revents & libc::POLLIN != 0 && !settle(set[*i].fd, c) {
                set[*i].revents &= !(libc::POLLIN | libc::POLLRDNORM);
            }
            if c.has_error() {
                set[*i].revents |= libc::POLLERR;
            }
        }
        let answered = settle_pending_entries(set, &pend, &held);
        for i in ready {
            set[i].revents |= libc::POLLIN;
        }
        let n = set.iter().filter(|p| p.revents != 0).count() as c_int;
        if n > 0 || t == 0 {
            return Polled::Done(n);
        }
        if answered {
            // Its request's socket is gone: the set is looked at afresh.
            return Polled::Moved;
        }
        let ended = with_bells
            .get(set.len() + bells.len()..)
            .is_some_and(|e| e.iter().any(|p| p.revents != 0));
        if ended {
            return Polled::Moved;
        }
    }
}

/// Takes the writability out of the kernel's watch of the pending
/// connections in `set` whose grant is awaited (`held`, in `pend`'s
/// order): no write proceeds before the grant or the refusal (see
/// `pending::held_events`), and the request's socket wakes the wait
/// instead.
fn hold_writes(set: &mut [pollfd], pend: &Watched<Pending>, held: &[bool]) {
    for ((i, _), &held) in pend.iter().zip(held) {
        if held {
            set[*i].events &= !(libc::POLLOUT | libc::POLLWRNORM | libc::POLLWRBAND);
        }
    }
}

/// Settles the pending connections' entries of `set` after a wait: each
/// readable only with its own bytes, and writable once the grant or the
/// refusal came if its grant was awaited as the wait began (`held`).
/// Returns whether an answer came (its request's socket is gone then).
fn settle_pending_entries(set: &mut [pollfd], pend: &Watched<Pending>, held: &[bool]) -> bool {
    let mut answered = false;
    for ((i, p), &held) in pend.iter().zip(held) {
        let e = &mut set[*i];
        if e.revents & libc::POLLIN != 0 && !settle_pending(e.fd, p) {
            e.revents &= !(libc::POLLIN | libc::POLLRDNORM);
        }
        // Woken by its request's socket for a write only.
        if e.events & libc::POLLIN == 0 {
            e.revents &= !(libc::POLLIN | libc::POLLRDNORM);
        }
        if held && !awaits_grant(p) {
            answered = true;
            if e.events & libc::POLLOUT != 0 {
                // The connection's writability, held back until now, is
                // the kernel's again (or the direct connection's, whose
                // window is open before anything was written).
                e.revents |= libc::POLLOUT;
            }
        }
    }
    answered
}

/// Copies a wait on the program's `set` with the relay sockets `bells`
/// (each with its connection's place in `set`) after it (`with_bells`)
/// back into `set`: a byte on a relay socket marks its connection
/// readable, for `settle` to drain and judge (or, for a pending
/// connection's direct request, to read the grant); a hang-up of a
/// relayed connection's socket (the first `relayed` of `bells`), the
/// relay gone, hangs the connection up with it. A direct request's socket
/// hangs up when the relay is done with the request (it closes it after
/// a refusal): that is the connection's to look at, as a byte would be,
/// never its hang-up.
fn copy_rung(set: &mut [pollfd], with_bells: &[pollfd], bells: &[(usize, c_int)], relayed: usize) {
    for (p, w) in set.iter_mut().zip(with_bells) {
        p.revents = w.revents;
    }
    for (k, &(i, _)) in bells.iter().enumerate() {
        let rung = with_bells[set.len() + k].revents;
        if rung & libc::POLLIN != 0 || (k >= relayed && rung != 0) {
            set[i].revents |= libc::POLLIN;
        } else if rung != 0 {
            set[i].revents |= libc::POLLHUP;
        }
    }
}

/// The pending connections of a poll set whose direct request's grant is
/// awaited, with their places in the set and the request's socket, which
/// the wait watches beside them (their kernel sockets carry nothing until
/// the grant or the refusal).
fn granting(pend: &Watched<Pending>) -> impl Iterator<Item = (usize, c_int)> + '_ {
    #[cfg(feature = "xdp")]
    let watched = pend.iter().map(|(i, p)| (*i, p.granting_fd()));
    #[cfg(not(feature = "xdp"))]
    let watched = pend.iter().map(|(i, _)| (*i, -1));
    watched.filter(|&(_, fd)| fd >= 0)
}

/// Whether a pending connection's direct request awaits its grant
/// (`Pend::Granting`).
fn awaits_grant(p: &Pending) -> bool {
    #[cfg(feature = "xdp")]
    return p.granting_fd() >= 0;
    #[cfg(not(feature = "xdp"))]
    {
        let _ = p;
        false
    }
}

/// What entries of a poll set watch, with their places in the set.
pub(super) type Watched<T> = Vec<(usize, Arc<T>)>;

/// The entries of a poll set that watch a taken-over connection for
/// reading (with their places in the set), and those that watch a
/// pending one still waiting for its first bytes; a pending one whose
/// exchange is already in is resolved now.
fn read_watched(set: &[pollfd]) -> (Watched<Conn>, Watched<Pending>) {
    let mut shm: Vec<(usize, Arc<Conn>)> = Vec::new();
    let mut pend: Vec<(usize, Arc<Pending>)> = Vec::new();
    for (i, p) in set.iter().enumerate() {
        // A connection whose grant is awaited is watched for a write too
        // (see `pending::held_events`).
        #[cfg(feature = "xdp")]
        let write_held = p.events & libc::POLLIN == 0
            && p.events & libc::POLLOUT != 0
            && matches!(table::get(p.fd), Some(Entry::Pending(q)) if q.granting_fd() >= 0);
        #[cfg(not(feature = "xdp"))]
        let write_held = false;
        if write_held {
            if let Some(Entry::Pending(q)) = table::get(p.fd) {
                if let Resolved::NotYet = setup::resolve(p.fd, &q, false, true) {
                    pend.push((i, q));
                }
            }
            continue;
        }
        if p.events & libc::POLLIN == 0 {
            continue;
        }
        match table::get(p.fd) {
            Some(Entry::Shm(c)) => shm.push((i, c)),
            Some(Entry::Pending(q)) => {
                // Records of the exchange already in are taken now (see
                // `shm_epoll_wait`).
                match setup::resolve(p.fd, &q, false, true) {
                    Resolved::Shm(c) => shm.push((i, c)),
                    Resolved::NotYet => pend.push((i, q)),
                    Resolved::Kernel => {}
                    // Watched as a direct connection by the caller's next
                    // look (`direct_poll`).
                    #[cfg(feature = "xdp")]
                    Resolved::Direct(_) => {}
                }
            }
            _ => {}
        }
    }
    (shm, pend)
}
