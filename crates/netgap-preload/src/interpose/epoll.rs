//! epoll's `epoll_ctl`, `epoll_wait` and `epoll_pwait`: registrations are
//! recorded beside the kernel's, and a wait's events are settled by the
//! rings of the taken-over connections they name.

use super::poll::{left_ms, settle, settle_pending};
use crate::bell::register_bell;
use crate::conn::{spin_until, Conn};
use crate::errno::{errno, set_errno};
use crate::pending::Pending;
use crate::real;
use crate::setup;
use crate::table::{self, Interest};
use libc::{c_int, epoll_event, pollfd};
use std::sync::Arc;

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
        if let Some(table::Entry::Direct(_)) = table::get(fd) {
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
                if let Some(table::Entry::Direct(d)) = table::get(fd) {
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
        if let Some(table::Entry::Direct(d)) = table::get(fd) {
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
        Some(table::Entry::Pending(p)) if p.granting_fd() >= 0 => {
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
