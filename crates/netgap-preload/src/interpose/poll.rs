//! The readiness calls: `poll`, `ppoll`, `select` and epoll's
//! `epoll_ctl`, `epoll_wait` and `epoll_pwait`. A taken-over connection
//! is ready by its ring; the kernel socket under it carries only its
//! doorbells, which wake a wait that sleeps in the kernel.

use crate::bell::register_bell;
use crate::conn::{spin_until, Conn};
use crate::errno::{errno, set_errno};
use crate::pending::Pending;
use crate::real;
use crate::setup::{self, Resolved};
use crate::table::{self, Entry, Interest};
use libc::timeval;
use libc::{c_int, epoll_event, fd_set, nfds_t, pollfd};
use std::sync::Arc;

/// Whether a taken-over connection the kernel calls readable really is
/// (see `Conn::settle`); a connector's offer is ended first if the answer
/// is in.
fn settle(fd: c_int, c: &Arc<Conn>) -> bool {
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
fn settle_pending(fd: c_int, p: &Arc<Pending>) -> bool {
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

/// `select(2)`: as [`poll`] for the read set.
///
/// # Safety
///
/// As for the C library's `select`.
#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut fd_set,
    writefds: *mut fd_set,
    exceptfds: *mut fd_set,
    timeout: *mut timeval,
) -> c_int {
    #[cfg(feature = "xdp")]
    if super::select_direct::has_direct(
        nfds.min(libc::FD_SETSIZE as c_int),
        [readfds, writefds, exceptfds],
    ) {
        // SAFETY: the program's own arguments (select's contract).
        return unsafe {
            super::select_direct::select_as_poll(nfds, (readfds, writefds, exceptfds), timeout)
        };
    }
    if readfds.is_null() || nfds <= 0 {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::select()(nfds, readfds, writefds, exceptfds, timeout) };
    }
    let limit = nfds.min(libc::FD_SETSIZE as c_int);
    let shm: Vec<(c_int, Arc<Conn>)> = (0..limit)
        // SAFETY: `readfds` is a valid set and `fd < FD_SETSIZE`.
        .filter(|&fd| unsafe { libc::FD_ISSET(fd, readfds) })
        .filter_map(|fd| match table::get(fd) {
            Some(Entry::Shm(c)) => Some((fd, c)),
            _ => None,
        })
        .collect();
    if shm.is_empty() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::select()(nfds, readfds, writefds, exceptfds, timeout) };
    }
    let mut ready: Vec<c_int> = shm
        .iter()
        .filter(|(_, c)| c.read_ready())
        .map(|(fd, _)| *fd)
        .collect();
    if ready.is_empty() {
        ready = shm
            .iter()
            .filter(|(_, c)| c.arm_read_watched(bell_fits_select(c)))
            .map(|(fd, _)| *fd)
            .collect();
    }
    if ready.is_empty() {
        if !shm.iter().any(|(_, c)| bell_fits_select(c)) {
            // SAFETY: the program's own arguments, passed on.
            return unsafe { real::select()(nfds, readfds, writefds, exceptfds, timeout) };
        }
        // SAFETY: the program's sets, valid (select's contract).
        return unsafe { select_with_bells(nfds, (readfds, writefds, exceptfds), timeout, &shm) };
    }
    let mut zero = timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: the program's sets, with a zero timeout of our own.
    let r = unsafe { real::select()(nfds, readfds, writefds, exceptfds, &mut zero) };
    if r < 0 {
        return r;
    }
    for fd in ready {
        // SAFETY: `readfds` is valid and `fd < FD_SETSIZE`.
        unsafe { libc::FD_SET(fd, readfds) };
    }
    // SAFETY: valid sets or null.
    unsafe { fds_in(readfds, limit) + fds_in(writefds, limit) + fds_in(exceptfds, limit) }
}

/// Whether a relayed connection's socket to its relay can be watched in a
/// `select` beside it (as in `poll`): the set has room for its number.
fn bell_fits_select(c: &Conn) -> bool {
    (0..libc::FD_SETSIZE as c_int).contains(&c.bell())
}

/// The sets a `select` is given: read, write, exceptions.
type FdSets = (*mut fd_set, *mut fd_set, *mut fd_set);

/// `epoll_ctl(2)`: registrations are recorded so [`epoll_wait`] can report
/// taken-over connections with data in their rings.
///
/// # Safety
///
/// As for the C library's `epoll_ctl`.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut epoll_event,
) -> c_int {
    // The kernel's registrations and the table's record of them change as
    // one (see `table::registering`).
    let _registering = table::registering();
    #[cfg(feature = "xdp")]
    if op != libc::EPOLL_CTL_DEL && !event.is_null() {
        if let Some(Entry::Direct(_)) = table::get(fd) {
            // SAFETY: a non-null event is valid for reads (epoll_ctl's
            // contract); the struct is packed, so it is copied out whole.
            let mut quiet = unsafe { std::ptr::read_unaligned(event) };
            quiet.events &= (libc::EPOLLET | libc::EPOLLONESHOT) as u32;
            // The kernel socket is registered without events (its
            // connection's socket beside it wakes the wait), and the
            // program's interest is recorded as asked.
            // SAFETY: the program's epoll and descriptor, an event on the
            // stack.
            let r = unsafe { real::epoll_ctl()(epfd, op, fd, &mut quiet) };
            if r == 0 {
                let e = errno();
                // SAFETY: as above.
                let ev = unsafe { std::ptr::read_unaligned(event) };
                let bell = register_bell(epfd, op, fd, ev.events, ev.u64);
                table::epoll_ctl(
                    epfd,
                    op,
                    fd,
                    Some(Interest {
                        events: ev.events,
                        data: ev.u64,
                        bell,
                    }),
                );
                if let Some(Entry::Direct(d)) = table::get(fd) {
                    d.forget_seen();
                }
                set_errno(e);
            }
            return r;
        }
    }
    #[cfg(feature = "xdp")]
    let mut held = granting_held(fd, op, event);
    #[cfg(feature = "xdp")]
    let event_for_kernel = held.as_mut().map_or(event, std::ptr::from_mut);
    #[cfg(not(feature = "xdp"))]
    let event_for_kernel = event;
    // SAFETY: the program's own arguments, passed on (its event, or a
    // copy of it on the stack).
    let r = unsafe { real::epoll_ctl()(epfd, op, fd, event_for_kernel) };
    if r == 0 {
        let e = errno();
        let interest = if op == libc::EPOLL_CTL_DEL {
            // Its relay socket leaves the epoll with it.
            register_bell(epfd, op, fd, 0, 0);
            None
        } else if event.is_null() {
            None
        } else {
            // SAFETY: a non-null event is valid for reads (the kernel just
            // read it); the struct is packed, so it is copied out whole.
            let ev = unsafe { std::ptr::read_unaligned(event) };
            Some(Interest {
                events: ev.events,
                data: ev.u64,
                bell: register_bell(epfd, op, fd, ev.events, ev.u64),
            })
        };
        table::epoll_ctl(epfd, op, fd, interest);
        // A registration made or changed reports what is ready now, edge
        // or not, as the kernel's does.
        #[cfg(feature = "xdp")]
        if let Some(Entry::Direct(d)) = table::get(fd) {
            d.forget_seen();
        }
        set_errno(e);
    }
    r
}

/// The program's event for `fd` as the kernel gets it when `fd` is an
/// accepted connection whose grant is awaited: without its writability
/// (`pending::held_events`); None otherwise (the program's own is passed
/// on).
#[cfg(feature = "xdp")]
fn granting_held(fd: c_int, op: c_int, event: *const epoll_event) -> Option<epoll_event> {
    if op == libc::EPOLL_CTL_DEL || event.is_null() {
        return None;
    }
    match table::get(fd) {
        Some(Entry::Pending(p)) if p.granting_fd() >= 0 => {
            // SAFETY: a non-null event is valid for reads (epoll_ctl's
            // contract); the struct is packed, so it is copied out whole.
            let mut ev = unsafe { std::ptr::read_unaligned(event) };
            ev.events = crate::pending::held_events(ev.events);
            Some(ev)
        }
        _ => None,
    }
}

/// `epoll_wait(2)`.
///
/// # Safety
///
/// As for the C library's `epoll_wait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the program's own arguments, passed on; `events` holds `max`
    // entries (epoll_wait's contract).
    unsafe {
        shm_epoll_wait(epfd, events, max, timeout, |t| {
            real::epoll_wait()(epfd, events, max, t)
        })
    }
}

/// `epoll_pwait(2)`.
///
/// # Safety
///
/// As for the C library's `epoll_pwait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: as for epoll_wait.
    unsafe {
        shm_epoll_wait(epfd, events, max, timeout, |t| {
            real::epoll_pwait()(epfd, events, max, t, sigmask)
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

/// Counts the descriptors below `limit` set in `s` (null: none).
///
/// # Safety
///
/// `s` null or a valid set.
unsafe fn fds_in(s: *const fd_set, limit: c_int) -> c_int {
    if s.is_null() {
        return 0;
    }
    (0..limit.min(libc::FD_SETSIZE as c_int))
        // SAFETY: a valid set, indices below FD_SETSIZE.
        .filter(|&fd| unsafe { libc::FD_ISSET(fd, s) })
        .count() as c_int
}

/// `select`'s sleep when the read set holds relayed connections: their
/// relay sockets are watched too, and one that wakes marks its
/// connection readable if its ring has something (else the wait goes on
/// with what is left of the timeout, which Linux's select keeps
/// updated).
///
/// # Safety
///
/// As for the C library's `select`; `sets.0` is not null.
unsafe fn select_with_bells(
    nfds: c_int,
    (readfds, writefds, exceptfds): FdSets,
    timeout: *mut timeval,
    shm: &[(c_int, Arc<Conn>)],
) -> c_int {
    let bells: Vec<(c_int, &Arc<Conn>)> = shm
        .iter()
        .filter(|(_, c)| bell_fits_select(c))
        .map(|(fd, c)| (*fd, c))
        .collect();
    let top = bells
        .iter()
        .map(|(_, c)| c.bell() + 1)
        .fold(nfds, c_int::max);
    // SAFETY: valid sets (the caller's contract), copied by value.
    let (want_r, want_w, want_e) = unsafe {
        (
            *readfds,
            (!writefds.is_null()).then(|| *writefds),
            (!exceptfds.is_null()).then(|| *exceptfds),
        )
    };
    loop {
        let mut rs = want_r;
        for (_, c) in &bells {
            // SAFETY: `rs` is a set and the socket is below FD_SETSIZE.
            unsafe { libc::FD_SET(c.bell(), &mut rs) };
        }
        // SAFETY: the program's write and exception sets, restored for
        // each try; our own copy of its read set.
        let r = unsafe {
            if let Some(w) = want_w {
                *writefds = w;
            }
            if let Some(e) = want_e {
                *exceptfds = e;
            }
            real::select()(top, &mut rs, writefds, exceptfds, timeout)
        };
        if r < 0 {
            return r;
        }
        for (fd, c) in &bells {
            // SAFETY: as above.
            if unsafe { libc::FD_ISSET(c.bell(), &rs) } {
                // SAFETY: as above.
                unsafe { libc::FD_CLR(c.bell(), &mut rs) };
                if settle(*fd, c) {
                    // SAFETY: `fd` is below FD_SETSIZE (it was in the set).
                    unsafe { libc::FD_SET(*fd, &mut rs) };
                }
            }
        }
        // SAFETY: the program's read set, valid.
        unsafe { *readfds = rs };
        // SAFETY: valid sets or null.
        let n = unsafe { fds_in(readfds, nfds) + fds_in(writefds, nfds) + fds_in(exceptfds, nfds) };
        if n > 0 || r == 0 {
            return n;
        }
        // Only a wake-up for nothing (a late one): arm and wait again.
        let ready: Vec<c_int> = bells
            .iter()
            .filter(|(_, c)| c.arm_read_bell())
            .map(|(fd, _)| *fd)
            .collect();
        if !ready.is_empty() {
            for fd in &ready {
                // SAFETY: as above.
                unsafe { libc::FD_SET(*fd, readfds) };
            }
            return ready.len() as c_int;
        }
    }
}

/// The shared body of `epoll_wait` and `epoll_pwait`: `wait(timeout)` is
/// the real call.
///
/// # Safety
///
/// `events` valid for writes of `max` entries.
unsafe fn shm_epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    wait: impl Fn(c_int) -> c_int,
) -> c_int {
    #[cfg(feature = "xdp")]
    if !events.is_null() && max > 0 {
        let direct = table::epoll_direct(epfd);
        if !direct.is_empty() {
            // SAFETY: the caller's contract.
            return unsafe {
                super::poll_direct::direct_epoll_wait(epfd, events, max, timeout, &wait, direct)
            };
        }
    }
    #[cfg(feature = "xdp")]
    let start = std::time::Instant::now();
    // SAFETY: the caller's contract.
    let n = unsafe { rings_epoll_wait(epfd, events, max, timeout, &wait) };
    #[cfg(feature = "xdp")]
    if n > 0 {
        // A connector's offer went direct during this wait: its
        // connection's socket joined the epoll and wakes it for every
        // frame (an acknowledgment too), so its events are the
        // connection's to say, as in a wait that began with it direct.
        let direct = table::epoll_direct(epfd);
        if !direct.is_empty() {
            use super::poll_direct::{direct_epoll_wait, settle_direct};
            // SAFETY: `events` holds `max` entries, the first `n` written.
            let n = unsafe { settle_direct(events, n as usize, &direct, &[]) };
            let left = left_ms(timeout, start);
            if n > 0 || left == 0 {
                return n as c_int;
            }
            // SAFETY: the caller's contract.
            return unsafe { direct_epoll_wait(epfd, events, max, left, &wait, direct) };
        }
    }
    n
}

/// [`shm_epoll_wait`] for an epoll with no direct connection.
///
/// # Safety
///
/// `events` valid for writes of `max` entries.
pub(super) unsafe fn rings_epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    wait: impl Fn(c_int) -> c_int,
) -> c_int {
    let (mut shm, mut pend) = table::epoll_entries(epfd);
    if !pend.is_empty() {
        for (fd, _, p) in &pend {
            // Records of the exchange already in are taken now, so a wait
            // never wakes for bytes that are not the program's.
            setup::resolve(*fd, p, false, true);
        }
        shm = table::epoll_entries(epfd).0;
    }
    if events.is_null() || max <= 0 {
        return wait(timeout);
    }
    let start = std::time::Instant::now();
    if shm.is_empty() && pend.is_empty() {
        let n = wait(timeout);
        if n <= 0 {
            return n;
        }
        // Another thread may have registered a taken-over connection while
        // this one slept (a threaded server's worker hands a kept-alive
        // connection back to the thread that waits): its events are
        // settled as any other's.
        (shm, pend) = table::epoll_entries(epfd);
        if shm.is_empty() && pend.is_empty() {
            return n;
        }
        // SAFETY: `events` holds `max` entries, the first `n` written by
        // the kernel.
        let n = unsafe { settle_events(events, n as usize, max as usize, &shm, &pend, &[]) };
        if n > 0 || left_ms(timeout, start) == 0 {
            return n as c_int;
        }
    }
    let wants_in = |i: &Interest| i.events & libc::EPOLLIN as u32 != 0;
    let mut spun = timeout == 0;
    loop {
        if !spun && !shm.is_empty() {
            // See `Conn::recv`: watch the rings a little before sleeping.
            spun = true;
            spin_until(|| shm.iter().any(|(_, i, c)| wants_in(i) && c.read_ready()));
        }
        let mut ready: Vec<Interest> = shm
            .iter()
            .filter(|(_, i, c)| wants_in(i) && c.read_ready())
            .map(|(_, i, _)| *i)
            .collect();
        if ready.is_empty() {
            ready = shm
                .iter()
                .filter(|(_, i, c)| wants_in(i) && c.arm_read_watched(i.bell))
                .map(|(_, i, _)| *i)
                .collect();
        }
        let t = if ready.is_empty() {
            left_ms(timeout, start)
        } else {
            0
        };
        let n = wait(t);
        if n < 0 {
            return n;
        }
        if n > 0 {
            // The registrations as they are now: one another thread made
            // while this one slept brings events this wait must settle
            // (its relay socket's and its own, with the same data, are one
            // event to the program, which acts on each event it is given),
            // and one it removed is reported no more.
            (shm, pend) = table::epoll_entries(epfd);
            ready.retain(|i| shm.iter().any(|(_, r, _)| r.data == i.data));
        }
        // SAFETY: `events` holds `max` entries, the first `n` written by the
        // kernel.
        let n = unsafe { settle_events(events, n as usize, max as usize, &shm, &pend, &ready) };
        if n > 0 || t == 0 {
            return n as c_int;
        }
    }
}

/// The events of an epoll that say a descriptor hung up or failed.
const HANG_UPS: u32 = (libc::EPOLLHUP | libc::EPOLLERR | libc::EPOLLRDHUP) as u32;

/// What the kernel socket `fd` itself says of a hang-up or a failure now,
/// as epoll would report it to a registration of `interest`: the hang-up
/// and the failure always, the peer's shutdown only if asked for.
fn own_hang_ups(fd: c_int, interest: u32) -> u32 {
    let mut p = pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; a look that does not wait.
    if unsafe { real::poll()(&mut p, 1, 0) } <= 0 {
        return 0;
    }
    let mut said = 0;
    if p.revents & libc::POLLHUP != 0 {
        said |= libc::EPOLLHUP as u32;
    }
    if p.revents & libc::POLLERR != 0 {
        said |= libc::EPOLLERR as u32;
    }
    if p.revents & libc::POLLRDHUP != 0 && interest & libc::EPOLLRDHUP as u32 != 0 {
        said |= libc::EPOLLRDHUP as u32;
    }
    said
}

/// Corrects the kernel's `n` events for taken-over connections: readable
/// only with data or the end in the ring (doorbells alone are drained and
/// the event dropped if nothing else is left in it), and the ring-ready
/// registrations `ready` added. Returns the new count.
///
/// # Safety
///
/// `events` valid for reads and writes of `max` entries, the first `n`
/// initialised.
unsafe fn settle_events(
    events: *mut epoll_event,
    n: usize,
    max: usize,
    shm: &[(c_int, Interest, Arc<Conn>)],
    pend: &[(c_int, Interest, Arc<Pending>)],
    ready: &[Interest],
) -> usize {
    // Entries are packed structs: read and written unaligned, by value.
    let get = |k: usize| {
        // SAFETY: callers pass `k < max`, inside the program's array.
        unsafe { std::ptr::read_unaligned(events.add(k)) }
    };
    let put = |k: usize, ev: epoll_event| {
        // SAFETY: callers pass `k < max`, inside the program's array.
        unsafe { std::ptr::write_unaligned(events.add(k), ev) }
    };
    let mut out = 0;
    // Outputs of relayed connections whose relay socket is registered
    // beside them: a wait can bring an event from each with the same
    // data, which must reach the program as one (a program told twice
    // that a descriptor is readable reads it twice, and wrk takes the
    // second read's EAGAIN for an error).
    let mut belled: Vec<(u64, usize)> = Vec::new();
    for k in 0..n {
        let mut ev = get(k);
        let data = ev.u64;
        let conn = shm.iter().find(|(_, i, _)| i.data == data);
        let pending = pend
            .iter()
            .find(|(_, i, _)| i.data == data)
            .filter(|_| conn.is_none());
        if let Some((fd, i, p)) = pending {
            // The event may be the direct request's socket's, registered
            // with the connection's data and read interest whatever the
            // program asked: the relay closes that socket once it has
            // refused, and its hang-up is not the connection's (a program
            // told of one closes the connection), nor its byte the
            // connection's data. Either wakes the connection to be looked
            // at; its own hang-up is its kernel socket's.
            let read = libc::EPOLLIN as u32;
            let had_in = ev.events & read != 0;
            if had_in || ev.events & HANG_UPS != 0 {
                let own = if ev.events & HANG_UPS != 0 {
                    own_hang_ups(*fd, i.events)
                } else {
                    0
                };
                let readable = settle_pending(*fd, p) && had_in && i.events & read != 0;
                ev.events &= !(HANG_UPS | (libc::EPOLLIN | libc::EPOLLRDNORM) as u32);
                ev.events |= own | if readable { read } else { 0 };
            }
        } else if ev.events & libc::EPOLLIN as u32 != 0 {
            if let Some((fd, _, c)) = conn {
                if !settle(*fd, c) {
                    ev.events &= !((libc::EPOLLIN | libc::EPOLLRDNORM) as u32);
                }
            }
        }
        if let Some((_, _, c)) = conn {
            if c.has_error() {
                ev.events |= libc::EPOLLERR as u32;
            }
        }
        if let Some((_, i, _)) = conn.filter(|(_, i, _)| i.bell) {
            if let Some(&(_, at)) = belled.iter().find(|(d, _)| *d == i.data) {
                let mut first = get(at);
                first.events |= ev.events;
                put(at, first);
                continue;
            }
            if ev.events != 0 {
                belled.push((i.data, out));
            }
        }
        if ev.events != 0 {
            put(out, ev);
            out += 1;
        }
    }
    for i in ready {
        match (0..out).find(|&k| get(k).u64 == i.data) {
            Some(k) => {
                let mut ev = get(k);
                ev.events |= libc::EPOLLIN as u32;
                put(k, ev);
            }
            None if out < max => {
                put(
                    out,
                    epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: i.data,
                    },
                );
                out += 1;
            }
            None => {}
        }
    }
    out
}
