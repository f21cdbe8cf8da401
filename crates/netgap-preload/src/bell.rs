//! A relayed connection's socket to its relay in the program's epolls:
//! registered beside the connection's descriptor, with the program's data
//! and read interest, so that the relay wakes a wait in that epoll with a
//! byte on it (see `netgap_shm::wait::WAIT_BELL`) instead of a doorbell
//! from the other host.

use crate::errno::{errno, set_errno};
use crate::real;
use crate::table::{self, Entry};
use libc::{c_int, epoll_event};

/// A connection registered in epolls before it moved to its relay (an
/// accepted one is registered while its hello is still unread): its
/// relay socket joins it in each, as `epoll_ctl` would have done.
pub(crate) fn bell_joins_epolls(fd: c_int) {
    let e = errno();
    let _registering = table::registering();
    #[cfg(feature = "xdp")]
    let direct = matches!(table::get(fd), Some(Entry::Direct(_)));
    for (epfd, i) in table::epoll_regs_without_bell(fd) {
        #[cfg(feature = "xdp")]
        if direct {
            // The kernel socket of a direct connection waits without
            // events: its connection's socket wakes the wait.
            let mut quiet = epoll_event {
                events: i.events & (libc::EPOLLET | libc::EPOLLONESHOT) as u32,
                u64: i.data,
            };
            // SAFETY: a plain epoll_ctl on the program's epoll and its own
            // descriptor, with an event on the stack.
            unsafe { real::epoll_ctl()(epfd, libc::EPOLL_CTL_MOD, fd, &mut quiet) };
        }
        if register_bell(epfd, libc::EPOLL_CTL_ADD, fd, i.events, i.data) {
            table::epoll_set_bell(epfd, fd);
        }
    }
    set_errno(e);
}

/// Keeps a relayed connection's socket to its relay registered in `epfd`
/// beside the connection's descriptor `fd`, with the program's data and
/// read interest, so that the relay wakes a wait in that epoll with a
/// byte on it, on this host (see `netgap_shm::wait::WAIT_BELL`), instead of a
/// doorbell from the other host. Returns whether it is registered; where
/// it is not (not relayed, no read interest, or the socket already
/// registered in that epoll for another descriptor of the connection), a
/// wait falls back on the doorbell.
pub(crate) fn register_bell(epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> bool {
    let (bell, any_interest) = match table::get(fd) {
        Some(Entry::Shm(c)) => (c.bell(), false),
        // A direct request's socket, in the connection's place until its
        // grant: registered beside it, never noted as its bell (the
        // connection's own joins when the grant comes).
        #[cfg(feature = "xdp")]
        Some(Entry::Pending(p)) => {
            let relay = p.granting_fd();
            if relay >= 0 {
                granting_in_epoll(epfd, op, relay, events, data);
            }
            return false;
        }
        // A direct connection's socket, readable when frames arrived
        // (acknowledgments too, which a writer waits for).
        #[cfg(feature = "xdp")]
        Some(Entry::Direct(d)) => (d.wait_fd(), true),
        _ => return false,
    };
    if bell < 0 {
        return false;
    }
    let flags = (libc::EPOLLET | libc::EPOLLONESHOT) as u32;
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32 | (events & flags),
        u64: data,
    };
    let had = table::epoll_bell(epfd, fd);
    let wants = op != libc::EPOLL_CTL_DEL && (any_interest || events & libc::EPOLLIN as u32 != 0);
    // SAFETY: plain epoll_ctl calls on the program's epoll and the
    // connection's own relay socket, with an event on the stack.
    unsafe {
        if !wants {
            if had {
                real::epoll_ctl()(epfd, libc::EPOLL_CTL_DEL, bell, &mut ev);
            }
            return false;
        }
        if had {
            return real::epoll_ctl()(epfd, libc::EPOLL_CTL_MOD, bell, &mut ev) == 0;
        }
        // EEXIST: another descriptor of the connection holds it there,
        // with its own data; this one falls back on the doorbell.
        real::epoll_ctl()(epfd, libc::EPOLL_CTL_ADD, bell, &mut ev) == 0
    }
}

/// An accepted connection whose direct request's grant is awaited
/// (`Pend::Granting`): the request's socket `relay` joins (`op`
/// `EPOLL_CTL_ADD`) `fd` in each epoll it is registered in, with the
/// program's data and read interest, so the grant or the refusal wakes a
/// wait there; once they came, it leaves them (`EPOLL_CTL_DEL`).
#[cfg(feature = "xdp")]
pub(crate) fn granting_in_epolls(fd: c_int, relay: c_int, op: c_int) {
    let e = errno();
    let _registering = table::registering();
    for (epfd, i) in table::epoll_regs_without_bell(fd) {
        granting_in_epoll(epfd, op, relay, i.events, i.data);
    }
    set_errno(e);
}

/// Registers (`op`) a direct request's socket `relay` in `epfd` as the
/// program registered its connection: read interest, its data, its
/// edge-triggered and one-shot flags.
#[cfg(feature = "xdp")]
pub(crate) fn granting_in_epoll(epfd: c_int, op: c_int, relay: c_int, events: u32, data: u64) {
    let flags = (libc::EPOLLET | libc::EPOLLONESHOT) as u32;
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32 | (events & flags),
        u64: data,
    };
    // SAFETY: a plain epoll_ctl on the program's epoll and the library's
    // own request socket, with an event on the stack.
    unsafe { real::epoll_ctl()(epfd, op, relay, &mut ev) };
}
