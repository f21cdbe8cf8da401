//! `select(2)` over sets holding taken-over connections: as `poll` for
//! the read set, each relayed connection's relay socket watched beside it.

use super::poll::settle;
use crate::conn::Conn;
use crate::real;
use crate::table::{self, Entry};
use libc::{c_int, fd_set, timeval};
use std::sync::Arc;

/// `select(2)`: as [`poll`](super::poll::poll) for the read set.
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
