//! `poll` and epoll over sets that hold direct connections (the library's
//! `xdp` feature): each is ready as its connection says, after a pump,
//! and a wait watches its AF_XDP socket in its place for at most its next
//! timer; the rest of the set is waited on as `poll.rs` waits on it.

use super::epoll::rings_epoll_wait;
use super::poll::{left_ms, rings_poll, Polled, Watched};
use crate::table::{self, Entry, Interest};
use libc::{c_int, epoll_event, nfds_t, pollfd};
use std::sync::Arc;

/// The entries of a poll set that are direct connections, with their
/// places in the set.
pub(super) fn direct_watched(set: &[pollfd]) -> Watched<crate::direct::Direct> {
    set.iter()
        .enumerate()
        .filter_map(|(i, p)| match table::get(p.fd) {
            Some(Entry::Direct(d)) => Some((i, d)),
            // Gone direct, the table not switched yet.
            Some(Entry::Shm(c)) => c.went_direct().map(|d| (i, d)),
            _ => None,
        })
        .collect()
}

/// A poll whose set holds direct connections: each is ready as its
/// connection says (after a pump); while none is, the wait watches each
/// one's `wait_fd` in its place (frames arrived) and lasts at most until
/// the nearest of their timers, after which they are pumped and the wait
/// goes on: the program sees no early return.
///
/// # Safety
///
/// `fds` valid for `nfds` entries.
pub(super) unsafe fn direct_poll(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    wait: &dyn Fn(*mut pollfd, nfds_t, c_int) -> c_int,
    direct: &Watched<crate::direct::Direct>,
) -> Polled {
    // SAFETY: poll's contract: `fds` holds `nfds` valid entries.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let asked: Vec<(c_int, i16)> = direct
        .iter()
        .map(|(i, _)| (set[*i].fd, set[*i].events))
        .collect();
    let ready_now = || -> Vec<(usize, i16)> {
        direct
            .iter()
            .zip(&asked)
            .map(|((i, d), (_, ev))| (*i, d.poll_events(*ev)))
            .filter(|(_, r)| *r != 0)
            .collect()
    };
    let start = std::time::Instant::now();
    loop {
        let mut ready = ready_now();
        let left = left_ms(timeout, start);
        let t = if ready.is_empty() {
            wait_ms(left, direct.iter().map(|(_, d)| d.next_timer()))
        } else {
            0
        };
        for (i, d) in direct {
            set[*i].fd = d.wait_fd();
            set[*i].events = libc::POLLIN;
        }
        // SAFETY: `fds` as given, the direct entries watching their
        // sockets for now.
        let r = unsafe { rings_poll(fds, nfds, t, wait) };
        for ((i, _), (fd, ev)) in direct.iter().zip(&asked) {
            set[*i].fd = *fd;
            set[*i].events = *ev;
            set[*i].revents = 0;
        }
        let r = match r {
            Polled::Done(r) if r < 0 => return Polled::Done(r),
            Polled::Done(r) => Some(r),
            Polled::Moved => None,
        };
        if ready.is_empty() {
            ready = ready_now();
        }
        for (i, r) in ready {
            set[i].revents = r;
        }
        let n = set.iter().filter(|p| p.revents != 0).count() as c_int;
        if n > 0 || left == 0 {
            return Polled::Done(n);
        }
        if r.is_none() {
            return Polled::Moved;
        }
    }
}

/// An epoll wait with direct connections registered: each is reported as
/// its connection says (after a pump; an edge-triggered one when its
/// readiness gained an event since it was last looked at), its `wait_fd`
/// (registered beside it with its data, see `bell::register_bell`) wakes
/// the wait when frames arrive, and the wait lasts at most until the
/// nearest of their timers, after which they are pumped and the wait goes
/// on: the program sees no early return.
///
/// # Safety
///
/// `events` valid for writes of `max > 0` entries.
pub(super) unsafe fn direct_epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    wait: &dyn Fn(c_int) -> c_int,
    mut direct: Vec<(c_int, Interest, Arc<crate::direct::Direct>)>,
) -> c_int {
    // Entries are packed structs: written unaligned, by value.
    let put = |k: usize, e: epoll_event| {
        // SAFETY: callers pass `k < max`, inside the program's array.
        unsafe { std::ptr::write_unaligned(events.add(k), e) }
    };
    let start = std::time::Instant::now();
    loop {
        let mut ready: Vec<epoll_event> = direct
            .iter()
            .filter_map(|(_, i, d)| {
                let ev = said(i, d);
                let new = d.newly_ready(ev);
                let edge = i.events & libc::EPOLLET as u32 != 0;
                let report = if edge { new } else { ev };
                (report != 0).then_some(epoll_event {
                    events: ev,
                    u64: i.data,
                })
            })
            .collect();
        ready.truncate(max as usize);
        let left = left_ms(timeout, start);
        let t = if ready.is_empty() {
            wait_ms(left, direct.iter().map(|(_, _, d)| d.next_timer()))
        } else {
            0
        };
        let room = max as usize - ready.len();
        let n = if room == 0 {
            0
        } else {
            // SAFETY: `events` holds `max ≥ room` entries.
            unsafe { rings_epoll_wait(epfd, events, room as c_int, t, wait) }
        };
        if n < 0 && ready.is_empty() {
            return n;
        }
        if n > 0 {
            // A connector's offer in this epoll may have gone direct in
            // the wait (its connection's socket joined the epoll and woke
            // it, for an acknowledgment too): settled as the others are.
            direct = table::epoll_direct(epfd);
        }
        let found: Vec<u64> = ready.iter().map(|r| r.u64).collect();
        // SAFETY: `events` holds `max` entries, the first `n` written by
        // the kernel.
        let mut out = unsafe { settle_direct(events, n.max(0) as usize, &direct, &found) };
        for r in ready {
            put(out, r);
            out += 1;
        }
        if out > 0 || left == 0 {
            return out as c_int;
        }
    }
}

/// The poll events direct connection `d` has of registration `i`'s.
fn said(i: &Interest, d: &crate::direct::Direct) -> u32 {
    u32::from(d.poll_events((i.events & 0xffff) as i16).cast_unsigned())
}

/// Corrects the first `n` events an epoll wait gave for the direct
/// connections registered in it: the connection's socket (frames arrived,
/// an acknowledgment too) or its TCP socket woke the wait, so the
/// connection says what it has, and an event it has nothing of, or one
/// of data in `found` (reported already), is dropped. The others are
/// kept as they are. Returns how many remain, packed at the front.
///
/// # Safety
///
/// `events` valid for reads and writes of `n` entries, all initialised.
pub(super) unsafe fn settle_direct(
    events: *mut epoll_event,
    n: usize,
    direct: &[(c_int, Interest, Arc<crate::direct::Direct>)],
    found: &[u64],
) -> usize {
    // Entries are packed structs: read and written unaligned, by value.
    let get = |k: usize| {
        // SAFETY: callers pass `k < n`, inside the program's array.
        unsafe { std::ptr::read_unaligned(events.add(k)) }
    };
    let put = |k: usize, e: epoll_event| {
        // SAFETY: as above.
        unsafe { std::ptr::write_unaligned(events.add(k), e) }
    };
    let mut out = 0usize;
    for k in 0..n {
        let mut e = get(k);
        let data = e.u64;
        if let Some((_, i, d)) = direct.iter().find(|(_, i, _)| i.data == data) {
            if found.contains(&data) {
                continue;
            }
            let ev = said(i, d);
            d.newly_ready(ev);
            if ev == 0 {
                continue;
            }
            e.events = ev;
        }
        put(out, e);
        out += 1;
    }
    out
}

/// How long a wait over direct connections sleeps: what is left of the
/// program's timeout (`left_ms`, negative: forever), cut to the earliest
/// of the connections' next timers, which must run even if nothing comes.
fn wait_ms(left_ms: c_int, timers: impl Iterator<Item = std::time::Duration>) -> c_int {
    let timer = timers.min().map_or(c_int::MAX, |d| {
        c_int::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX)
    });
    if left_ms < 0 {
        timer
    } else {
        left_ms.min(timer)
    }
}
