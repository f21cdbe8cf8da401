//! `select` over sets holding a direct connection: its kernel socket says
//! nothing of the connection (frames arrive on its AF_XDP socket), so the
//! sets are turned into a poll set and waited on with the library's own
//! `poll`, which asks each connection (`direct_poll`), and the results are
//! turned back into the sets as the kernel's `select` reports a poll's.
//! So is a `select` over a connector's relayed offer still open: it may go
//! direct while the wait sleeps, and the poll watches the offer's end
//! (`Conn::offer_end_fd`) beside its socket.

use super::poll::poll;
use crate::table::{self, Entry};
use libc::{c_int, fd_set, nfds_t, pollfd, timeval};

/// The events a `select` set stands for, as the kernel maps them: read
/// (`POLLIN` asked; in, hang-up and error answer), write (`POLLOUT`;
/// out and error) and exceptions (`POLLPRI`).
const READ_ANSWER: i16 = libc::POLLIN | libc::POLLRDNORM | libc::POLLHUP | libc::POLLERR;
const WRITE_ANSWER: i16 = libc::POLLOUT | libc::POLLWRNORM | libc::POLLERR;

/// Whether one of `sets` (null: none) holds, below `limit`, a direct
/// connection, whose kernel socket says nothing of it, or a relayed offer
/// still open, which may go direct while the wait sleeps (its answer taken
/// by the library's thread, see `Conn::offer_end_fd`), or an accepted
/// connection whose direct request's grant is awaited: the `select` is
/// then a poll (`select_direct`), which watches them all.
pub(crate) fn has_direct(limit: c_int, sets: [*mut fd_set; 3]) -> bool {
    (0..limit).any(|fd| {
        // SAFETY: valid sets or null (select's contract), fd below
        // FD_SETSIZE.
        let asked = sets
            .iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) });
        asked
            && match table::get(fd) {
                Some(Entry::Direct(_)) => true,
                Some(Entry::Shm(c)) => {
                    c.went_direct().is_some() || c.offered() && c.offer_end_fd() >= 0
                }
                Some(Entry::Pending(p)) => p.granting_fd() >= 0,
                _ => false,
            }
    })
}

/// Whether descriptor `fd` (below `FD_SETSIZE`) is in `s` (null: none).
///
/// # Safety
///
/// `s` null or a valid set.
unsafe fn in_set(s: *const fd_set, fd: c_int) -> bool {
    // SAFETY: a valid set, `fd` below FD_SETSIZE (the caller's).
    !s.is_null() && unsafe { libc::FD_ISSET(fd, s) }
}

/// `select` of the descriptors below `nfds` in the sets, as a poll: the
/// count of descriptors set on return, each set keeping only its ready
/// ones; `timeout` (null: forever) gets what is left of it, as Linux's
/// `select` leaves it.
///
/// # Safety
///
/// The sets null or valid, `timeout` null or valid for reads and writes
/// (select's contract).
pub(crate) unsafe fn select_as_poll(
    nfds: c_int,
    (readfds, writefds, exceptfds): (*mut fd_set, *mut fd_set, *mut fd_set),
    timeout: *mut timeval,
) -> c_int {
    let limit = nfds.min(libc::FD_SETSIZE as c_int);
    let mut set: Vec<pollfd> = Vec::new();
    for fd in 0..limit {
        let mut events = 0i16;
        // SAFETY: the program's sets (the caller's contract).
        unsafe {
            if in_set(readfds, fd) {
                events |= libc::POLLIN;
            }
            if in_set(writefds, fd) {
                events |= libc::POLLOUT;
            }
            if in_set(exceptfds, fd) {
                events |= libc::POLLPRI;
            }
        }
        if events != 0 {
            set.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: a non-null timeout is valid for reads.
        let t = unsafe { *timeout };
        let us = t.tv_sec.max(0).saturating_mul(1_000_000) + t.tv_usec.max(0);
        c_int::try_from(us.saturating_add(999) / 1000).unwrap_or(c_int::MAX)
    };
    let start = std::time::Instant::now();
    // SAFETY: `set` holds `set.len()` valid entries.
    let r = unsafe { poll(set.as_mut_ptr(), set.len() as nfds_t, ms) };
    if r < 0 {
        return r;
    }
    let mut n = 0;
    for p in &set {
        let answers = [
            (readfds, libc::POLLIN, READ_ANSWER),
            (writefds, libc::POLLOUT, WRITE_ANSWER),
            (exceptfds, libc::POLLPRI, libc::POLLPRI),
        ];
        for (s, asked, answer) in answers {
            if s.is_null() || p.events & asked == 0 {
                continue;
            }
            if p.revents & answer != 0 {
                n += 1;
            } else {
                // SAFETY: a valid set, `p.fd` below FD_SETSIZE.
                unsafe { libc::FD_CLR(p.fd, s) };
            }
        }
    }
    if !timeout.is_null() {
        let spent_us = i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX);
        // SAFETY: a non-null timeout is valid for reads and writes.
        unsafe {
            let t = &mut *timeout;
            let left_us = (t.tv_sec.saturating_mul(1_000_000) + t.tv_usec - spent_us).max(0);
            t.tv_sec = left_us / 1_000_000;
            t.tv_usec = left_us % 1_000_000;
        }
    }
    n
}
