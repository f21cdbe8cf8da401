//! The interposed calls. Each looks its descriptor up in the table: a
//! descriptor the library does not hold goes straight to the C library; a
//! taken-over connection's data moves through its channel; a pending one
//! is resolved first.
//!
//! Calls that need nothing of the library on a taken-over connection are
//! not interposed: `socket`, `bind`, `getsockname` and `getpeername` act
//! on the kernel socket under the descriptor, which is the connection's
//! real socket. `shutdown` acts on it too (a FIN seen by the peer after
//! the bytes already in the ring) and wakes the peer if it sleeps in a
//! blocking read. Socket options go to the
//! kernel socket too, except `TCP_NODELAY` and `TCP_CORK`, which are
//! recorded and not applied: the kernel socket then carries only
//! doorbells, which must never wait for Nagle or a cork. `fork` needs nothing either:
//! the channels are shared mappings the child inherits, and the rings keep
//! no index in private memory.

use crate::bell::register_bell;
use crate::conn::{spin_until, Conn};
use crate::errno::{errno, set_errno, Errno};
use crate::inherit::sync_cloexec;
use crate::log::log_line;
use crate::pending::Pending;
use crate::real;
use crate::setup::{self, Resolved};
use crate::table::{self, Entry, Interest};
use libc::{c_int, c_ulong, c_void, epoll_event, fd_set, iovec, msghdr, nfds_t, off_t, pollfd};
use libc::{size_t, sockaddr, socklen_t, ssize_t, timeval};
use std::sync::Arc;

/// Where a data call on a descriptor goes.
enum Route {
    /// The kernel socket (or any other file).
    Kernel,
    /// The shared-memory channel.
    Shm(Arc<Conn>),
    /// A pending connection with nothing in yet, read without blocking.
    Again,
}

fn route(fd: c_int, writing: bool) -> Route {
    route_with(fd, writing, false)
}

/// As [`route`]; `dontwait`: a read must not wait for a connector's
/// answer even on a blocking descriptor.
fn route_with(fd: c_int, writing: bool, dontwait: bool) -> Route {
    match table::get(fd) {
        None | Some(Entry::Listener { .. } | Entry::Region(_)) => Route::Kernel,
        Some(Entry::Shm(c)) if c.offered() => {
            // Writes go into the ring before the answer (see
            // `setup::connected`); a read needs the answer first.
            let wait = !writing && !dontwait && !c.nonblocking();
            match setup::finish_offer(fd, &c, wait) {
                Resolved::Shm(c) => Route::Shm(c),
                Resolved::Kernel => Route::Kernel,
                Resolved::NotYet if writing => Route::Shm(c),
                Resolved::NotYet => Route::Again,
            }
        }
        // A peer that closed for good gets the program's writes on the
        // kernel socket, which answers them as the kernel does.
        Some(Entry::Shm(c)) if writing && c.peer_closed_for_writes(fd) => Route::Kernel,
        Some(Entry::Shm(c)) => Route::Shm(c),
        Some(Entry::Pending(p)) => match setup::resolve(fd, &p, writing, dontwait) {
            Resolved::Shm(c) => Route::Shm(c),
            Resolved::Kernel => Route::Kernel,
            Resolved::NotYet => Route::Again,
        },
    }
}

fn done(r: Result<usize, Errno>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn fail(e: Errno) -> ssize_t {
    set_errno(e);
    -1
}

/// Receives on the channel honouring `MSG_WAITALL`; refuses `MSG_OOB`.
///
/// # Safety
///
/// Every iovec valid for writes of its length.
unsafe fn shm_recv(c: &Conn, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    if flags & libc::MSG_OOB != 0 {
        log_line!("fd {fd}: recv with MSG_OOB on a shm connection is not supported (EINVAL)");
        return fail(libc::EINVAL);
    }
    if flags & libc::MSG_WAITALL == 0 || flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller's contract.
        return done(unsafe { c.recv(fd, iov, flags) });
    }
    let want: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut got = 0usize;
    let mut rest: Vec<iovec> = iov.to_vec();
    while got < want {
        // SAFETY: `rest` are the caller's iovecs advanced past `got` bytes.
        match unsafe { c.recv(fd, &rest, flags & !libc::MSG_WAITALL) } {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                advance(&mut rest, n);
            }
            Err(e) if got == 0 => return fail(e),
            Err(_) => break,
        }
    }
    got as ssize_t
}

/// Drops the first `n` bytes from `iov`.
fn advance(iov: &mut Vec<iovec>, mut n: usize) {
    let mut first = 0;
    while n > 0 && first < iov.len() {
        let v = &mut iov[first];
        if n >= v.iov_len {
            n -= v.iov_len;
            first += 1;
        } else {
            // SAFETY: `n < iov_len`, so the advanced base stays in the buffer.
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
            v.iov_len -= n;
            n = 0;
        }
    }
    iov.drain(..first);
}

/// Sends on the channel as the kernel sends: a blocking send moves all
/// of the buffers (the ring's capacity at a time), a non-blocking one as
/// much as fits; EPIPE raises SIGPIPE unless the flags say not to.
fn shm_send(c: &Conn, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    if flags & libc::MSG_OOB != 0 {
        log_line!("fd {fd}: send with MSG_OOB on a shm connection is not supported (EOPNOTSUPP)");
        return fail(libc::EOPNOTSUPP);
    }
    let want: usize = iov.iter().map(|v| v.iov_len).sum();
    let all = flags & libc::MSG_DONTWAIT == 0 && !c.nonblocking();
    let mut sent = 0usize;
    // The program's iovecs, copied only once a send moved part of them.
    let mut rest: Option<Vec<iovec>> = None;
    loop {
        let now: &[iovec] = rest.as_deref().unwrap_or(iov);
        // SAFETY: `now` are the program's iovecs advanced past `sent`
        // bytes, valid for reads of their lengths (the call's contract).
        match unsafe { c.send(fd, now, flags) } {
            Ok(n) => {
                sent += n;
                if !all || sent >= want || n == 0 {
                    return sent as ssize_t;
                }
                advance(rest.get_or_insert_with(|| iov.to_vec()), n);
            }
            Err(e) if sent > 0 && e != libc::EPIPE => return sent as ssize_t,
            Err(e) => {
                if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    // SAFETY: raise has no preconditions; the kernel sends
                    // the writing thread SIGPIPE on a broken connection.
                    unsafe { libc::raise(libc::SIGPIPE) };
                }
                if sent > 0 {
                    return sent as ssize_t;
                }
                return fail(e);
            }
        }
    }
}

/// Builds the iovec list of a msghdr.
///
/// # Safety
///
/// `msg` valid, and its iov array valid for `msg_iovlen` entries.
unsafe fn msg_iov<'a>(msg: *const msghdr) -> &'a [iovec] {
    // SAFETY: the caller's contract.
    unsafe {
        let m = &*msg;
        if m.msg_iov.is_null() || m.msg_iovlen == 0 {
            return &[];
        }
        std::slice::from_raw_parts(m.msg_iov, m.msg_iovlen)
    }
}

/// `read(2)`.
///
/// # Safety
///
/// As for the C library's `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    match route(fd, false) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::read()(fd, buf, count) },
        Route::Again => fail(libc::EAGAIN),
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf,
                iov_len: count,
            }];
            // SAFETY: `buf` is valid for writes of `count` bytes (read's
            // contract).
            unsafe { shm_recv(&c, fd, &iov, 0) }
        }
    }
}

/// `write(2)`.
///
/// # Safety
///
/// As for the C library's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    match route(fd, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::write()(fd, buf, count) },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: count,
            }];
            shm_send(&c, fd, &iov, 0)
        }
    }
}

/// `readv(2)`.
///
/// # Safety
///
/// As for the C library's `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    match route(fd, false) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::readv()(fd, iov, iovcnt) },
        Route::Again => fail(libc::EAGAIN),
        Route::Shm(c) => {
            if iov.is_null() || iovcnt < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: readv's contract: `iov` holds `iovcnt` valid iovecs.
            let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            // SAFETY: each iovec is valid for writes (readv's contract).
            unsafe { shm_recv(&c, fd, v, 0) }
        }
    }
}

/// `writev(2)`.
///
/// # Safety
///
/// As for the C library's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    match route(fd, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::writev()(fd, iov, iovcnt) },
        Route::Shm(c) => {
            if iov.is_null() || iovcnt < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: writev's contract: `iov` holds `iovcnt` valid iovecs.
            let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            shm_send(&c, fd, v, 0)
        }
    }
}

/// `recv(2)`.
///
/// # Safety
///
/// As for the C library's `recv`.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    match route_with(fd, false, flags & libc::MSG_DONTWAIT != 0) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::recv()(fd, buf, len, flags) },
        Route::Again => fail(libc::EAGAIN),
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf,
                iov_len: len,
            }];
            // SAFETY: `buf` is valid for writes of `len` bytes.
            unsafe { shm_recv(&c, fd, &iov, flags) }
        }
    }
}

/// `send(2)`.
///
/// # Safety
///
/// As for the C library's `send`.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    match route(fd, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::send()(fd, buf, len, flags) },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            shm_send(&c, fd, &iov, flags)
        }
    }
}

/// `recvfrom(2)`: on a taken-over connection, as `recv` with no address.
///
/// # Safety
///
/// As for the C library's `recvfrom`.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    match route_with(fd, false, flags & libc::MSG_DONTWAIT != 0) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::recvfrom()(fd, buf, len, flags, addr, addrlen) },
        Route::Again => fail(libc::EAGAIN),
        Route::Shm(c) => {
            if !addrlen.is_null() {
                // SAFETY: a non-null `addrlen` is valid for writes.
                unsafe { *addrlen = 0 };
            }
            let iov = [iovec {
                iov_base: buf,
                iov_len: len,
            }];
            // SAFETY: `buf` is valid for writes of `len` bytes.
            unsafe { shm_recv(&c, fd, &iov, flags) }
        }
    }
}

/// `sendto(2)`: on a taken-over connection, as `send` (a connected TCP
/// socket ignores the address).
///
/// # Safety
///
/// As for the C library's `sendto`.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    match route(fd, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe {
            real::sendto()(fd, buf, len, flags, addr, addrlen)
        },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            shm_send(&c, fd, &iov, flags)
        }
    }
}

/// `recvmsg(2)`: data only (no address, no ancillary data on TCP).
///
/// # Safety
///
/// As for the C library's `recvmsg`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    match route_with(fd, false, flags & libc::MSG_DONTWAIT != 0) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::recvmsg()(fd, msg, flags) },
        Route::Again => fail(libc::EAGAIN),
        Route::Shm(c) => {
            if msg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: recvmsg's contract: `msg` and its iovecs are valid.
            unsafe {
                (*msg).msg_namelen = 0;
                (*msg).msg_controllen = 0;
                (*msg).msg_flags = 0;
                shm_recv(&c, fd, msg_iov(msg), flags)
            }
        }
    }
}

/// `sendmsg(2)`: the data of the message (a TCP socket has no address and
/// the library passes no ancillary data).
///
/// # Safety
///
/// As for the C library's `sendmsg`.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    match route(fd, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::sendmsg()(fd, msg, flags) },
        Route::Shm(c) => {
            if msg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: sendmsg's contract: `msg` and its iovecs are valid.
            let (iov, control) = unsafe { (msg_iov(msg), (*msg).msg_controllen) };
            if control != 0 {
                log_line!(
                    "fd {fd}: sendmsg with ancillary data on a shm connection: the data is dropped"
                );
            }
            shm_send(&c, fd, iov, flags)
        }
    }
}

/// The shared body of `sendfile` and `sendfile64`.
///
/// # Safety
///
/// `offset` null or valid for reads and writes.
unsafe fn shm_sendfile(
    c: &Conn,
    out: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: a non-null `offset` is valid (sendfile's contract).
    let off = unsafe { offset.as_mut() };
    done(c.sendfile(out, in_fd, off, count))
}

/// `sendfile(2)`: on a taken-over connection, the file is read straight
/// into the ring.
///
/// # Safety
///
/// As for the C library's `sendfile`.
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    match route(out, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::sendfile()(out, in_fd, offset, count) },
        // SAFETY: sendfile's contract on `offset`.
        Route::Shm(c) => unsafe { shm_sendfile(&c, out, in_fd, offset, count) },
    }
}

/// `sendfile64`: glibc's alias of `sendfile` for 64-bit offsets.
///
/// # Safety
///
/// As for the C library's `sendfile64`.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    match route(out, true) {
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel | Route::Again => unsafe { real::sendfile64()(out, in_fd, offset, count) },
        // SAFETY: sendfile's contract on `offset`.
        Route::Shm(c) => unsafe { shm_sendfile(&c, out, in_fd, offset, count) },
    }
}

/// `connect(2)`: to a local listener with the library, the connection is
/// made (blocking, even on a non-blocking socket: on one host it takes
/// microseconds) and offered the channel; otherwise untouched.
///
/// # Safety
///
/// As for the C library's `connect`.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let cand = match table::get(fd) {
        None => setup::candidate(fd, addr, len),
        Some(_) => None,
    };
    let Some(cand) = cand else {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::connect()(fd, addr, len) };
    };
    // SAFETY: plain fcntl calls on the program's descriptor.
    let flags = unsafe { real::fcntl()(fd, libc::F_GETFL, 0) };
    let nonblocking = flags >= 0 && flags & libc::O_NONBLOCK != 0;
    if nonblocking {
        // SAFETY: as above.
        unsafe { real::fcntl()(fd, libc::F_SETFL, (flags & !libc::O_NONBLOCK) as c_ulong) };
    }
    // SAFETY: the program's own arguments, passed on.
    let mut r = unsafe { real::connect()(fd, addr, len) };
    let mut e = errno();
    if r == 0 {
        if let Err(broken) = setup::connected(fd, cand, nonblocking) {
            r = -1;
            e = broken;
        }
    }
    if nonblocking {
        // SAFETY: restores the program's flags.
        unsafe { real::fcntl()(fd, libc::F_SETFL, flags as c_ulong) };
    }
    set_errno(e);
    r
}

/// `listen(2)`: a TCP listener also gets the library's beacon.
///
/// # Safety
///
/// As for the C library's `listen`.
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::listen()(fd, backlog) };
    if r == 0 && table::get(fd).is_none() {
        let e = errno();
        setup::listening(fd);
        set_errno(e);
    }
    r
}

/// After the process changed its user: each listener announces itself
/// again under the new user's beacon name, since only a connector of that
/// user can share a region with it (a server that listens as root and
/// serves as another user, as Apache's children do). The old beacon is
/// closed here (the process that kept the old user keeps its own).
fn user_changed(r: c_int) -> c_int {
    if r == 0 {
        let e = errno();
        for fd in table::listeners() {
            setup::listening(fd);
        }
        set_errno(e);
    }
    r
}

/// `setuid(2)`; on success each listener announces itself again under
/// the new user (only a connector of that user can share its regions).
///
/// # Safety
///
/// As for the C library's `setuid`.
#[no_mangle]
pub unsafe extern "C" fn setuid(uid: libc::uid_t) -> c_int {
    // SAFETY: the program's own argument, passed on.
    user_changed(unsafe { real::setuid()(uid) })
}

/// `setreuid(2)`; on success the listeners are announced again, as for
/// [`setuid`].
///
/// # Safety
///
/// As for the C library's `setreuid`.
#[no_mangle]
pub unsafe extern "C" fn setreuid(ruid: libc::uid_t, euid: libc::uid_t) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    user_changed(unsafe { real::setreuid()(ruid, euid) })
}

/// `setresuid(2)`; on success the listeners are announced again, as for
/// [`setuid`].
///
/// # Safety
///
/// As for the C library's `setresuid`.
#[no_mangle]
pub unsafe extern "C" fn setresuid(
    ruid: libc::uid_t,
    euid: libc::uid_t,
    suid: libc::uid_t,
) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    user_changed(unsafe { real::setresuid()(ruid, euid, suid) })
}

fn after_accept(lfd: c_int, fd: c_int, flags: c_int) {
    if fd >= 0 && matches!(table::get(lfd), Some(Entry::Listener { .. })) {
        let e = errno();
        setup::accepted(lfd, fd, flags);
        set_errno(e);
    }
}

/// `accept(2)`.
///
/// # Safety
///
/// As for the C library's `accept`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::accept()(fd, addr, len) };
    after_accept(fd, r, 0);
    r
}

/// `accept4(2)`.
///
/// # Safety
///
/// As for the C library's `accept4`.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::accept4()(fd, addr, len, flags) };
    after_accept(fd, r, flags);
    r
}

/// Forgets `fd` (closed, or about to be replaced by `dup2`), logging a
/// connection's counters when this was its last descriptor here; returns
/// that connection, whose peer is to be told once the descriptor is
/// closed ([`Conn::closing`]).
#[must_use]
fn forget(fd: c_int) -> Option<Arc<Conn>> {
    let mut last = None;
    let taken = table::take(fd);
    let bell = match &taken {
        Some(Entry::Shm(c)) => c.bell(),
        _ => -1,
    };
    // The relay socket stays registered (with this descriptor's data)
    // wherever it was beside `fd` while another descriptor keeps the
    // connection: take it out, or its wake-ups would name a closed
    // descriptor's data.
    for epfd in table::epoll_forget(fd) {
        if bell >= 0 {
            let mut ev = epoll_event { events: 0, u64: 0 };
            // SAFETY: a plain epoll_ctl on the program's epoll and the
            // connection's own relay socket.
            unsafe { real::epoll_ctl()(epfd, libc::EPOLL_CTL_DEL, bell, &mut ev) };
        }
    }
    match taken {
        Some(Entry::Shm(c)) if !table::shared_elsewhere(&c) => {
            c.log_close(fd);
            last = Some(c);
        }
        Some(Entry::Region(c)) => {
            if let Some(c) = c.upgrade() {
                c.region_closed(fd);
            }
        }
        _ => {}
    }
    last
}

/// `close(2)`: the last descriptor of a taken-over connection in this
/// process closes it as the kernel would (`Conn::last_close`).
///
/// # Safety
///
/// As for the C library's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let was = match table::get(fd) {
        Some(Entry::Shm(c)) => Some(c),
        _ => None,
    };
    let last = forget(fd);
    if let Some(c) = &last {
        c.last_close(fd);
    }
    // SAFETY: the program's own argument, passed on.
    let r = unsafe { real::close()(fd) };
    let e = errno();
    if let Some(c) = last {
        c.wake_peer();
    } else if let Some(c) = was {
        // Another descriptor of the connection stays open here.
        sync_cloexec(&c);
    }
    set_errno(e);
    r
}

/// `shutdown(2)`: on a taken-over connection the peer's blocking sleepers
/// are woken to see the FIN.
///
/// # Safety
///
/// As for the C library's `shutdown`.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::shutdown()(fd, how) };
    if r == 0 {
        if let Some(Entry::Shm(c)) = table::get(fd) {
            let e = errno();
            c.shut(how);
            set_errno(e);
        }
    }
    r
}

fn copy_entry(from: c_int, to: c_int) {
    if to < 0 {
        return;
    }
    if let Some(e) = table::get(from) {
        table::set(to, e);
    }
    after_fd_change(to);
}

/// A descriptor of a taken-over connection was made, closed or had its
/// close-on-exec flag changed: the connection's region follows the
/// connection's descriptors (see [`sync_cloexec`]).
fn after_fd_change(fd: c_int) {
    if let Some(Entry::Shm(c)) = table::get(fd) {
        let e = errno();
        sync_cloexec(&c);
        set_errno(e);
    }
}

/// `dup(2)`: the copy is the same connection.
///
/// # Safety
///
/// As for the C library's `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the program's own argument, passed on.
    let r = unsafe { real::dup()(fd) };
    copy_entry(fd, r);
    r
}

/// `dup2(2)`.
///
/// # Safety
///
/// As for the C library's `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let last = (old != new).then(|| forget(new)).flatten();
    if let Some(c) = &last {
        c.last_close(new);
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::dup2()(old, new) };
    if let Some(c) = last {
        c.wake_peer();
    }
    if r >= 0 && old != new {
        copy_entry(old, new);
    }
    r
}

/// `dup3(2)`.
///
/// # Safety
///
/// As for the C library's `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let last = (old != new).then(|| forget(new)).flatten();
    if let Some(c) = &last {
        c.last_close(new);
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::dup3()(old, new, flags) };
    if let Some(c) = last {
        c.wake_peer();
    }
    if r >= 0 {
        copy_entry(old, new);
    }
    r
}

fn set_nonblocking(fd: c_int, on: bool) {
    match table::get(fd) {
        Some(Entry::Shm(c)) => c.set_nonblocking(on),
        Some(Entry::Pending(p)) => p.set_nonblocking(on),
        _ => {}
    }
}

fn after_fcntl(fd: c_int, cmd: c_int, arg: c_ulong, r: c_int) {
    if r < 0 {
        return;
    }
    match cmd {
        libc::F_SETFL => set_nonblocking(fd, arg as c_int & libc::O_NONBLOCK != 0),
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => copy_entry(fd, r),
        libc::F_SETFD => after_fd_change(fd),
        _ => {}
    }
}

/// `fcntl(2)`. Declared with one `unsigned long` argument where C has
/// `...`: on the x86-64 and AArch64 Linux calling conventions a variadic
/// integer or pointer argument travels in the same register as a fixed
/// one, so the third argument (an int, a pointer, or nothing the command
/// reads) is passed on unchanged.
///
/// # Safety
///
/// As for the C library's `fcntl`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::fcntl()(fd, cmd, arg) };
    let e = errno();
    after_fcntl(fd, cmd, arg, r);
    set_errno(e);
    r
}

/// `fcntl64`: glibc's name for `fcntl` in programs built with 64-bit file
/// offsets (same argument passing as [`fcntl`]).
///
/// # Safety
///
/// As for the C library's `fcntl64`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::fcntl64()(fd, cmd, arg) };
    let e = errno();
    after_fcntl(fd, cmd, arg, r);
    set_errno(e);
    r
}

/// `ioctl(2)`: FIONREAD answers from the ring; FIONBIO is recorded (and
/// set on the kernel socket). Declared with one `unsigned long` argument
/// for the reason given at [`fcntl`].
///
/// # Safety
///
/// As for the C library's `ioctl`.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if request == libc::FIONREAD {
        if let Route::Shm(c) = route_with(fd, false, true) {
            return match c.readable(fd) {
                Ok(n) => {
                    let p = arg as *mut c_int;
                    if p.is_null() {
                        return fail(libc::EFAULT) as c_int;
                    }
                    // SAFETY: FIONREAD's argument is an int the caller
                    // provides for writing.
                    unsafe { *p = c_int::try_from(n).unwrap_or(c_int::MAX) };
                    0
                }
                Err(e) => fail(e) as c_int,
            };
        }
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::ioctl()(fd, request, arg) };
    if r == 0 && (request == libc::FIOCLEX || request == libc::FIONCLEX) {
        after_fd_change(fd);
    }
    if r == 0 && request == libc::FIONBIO {
        let e = errno();
        let p = arg as *const c_int;
        // SAFETY: FIONBIO's argument is a readable int (the kernel just
        // read it successfully).
        let on = !p.is_null() && unsafe { *p } != 0;
        set_nonblocking(fd, on);
        set_errno(e);
    }
    r
}

/// Whether a taken-over connection the kernel calls readable really is
/// (see `Conn::settle`); a connector's offer is ended first if the answer
/// is in.
fn settle(fd: c_int, c: &Arc<Conn>) -> bool {
    if !c.offered() {
        return c.settle(fd);
    }
    match setup::finish_offer(fd, c, false) {
        Resolved::Shm(c) => c.settle(fd),
        // The program's own bytes (or the end) on the kernel socket.
        Resolved::Kernel => true,
        Resolved::NotYet => false,
    }
}

/// Whether an accepted connection still pending that the kernel calls
/// readable really is: the exchange's records are taken first, and only
/// the program's own bytes (or its connection's end on shm) count.
fn settle_pending(fd: c_int, p: &Arc<Pending>) -> bool {
    match setup::resolve(fd, p, false, true) {
        Resolved::Shm(c) => settle(fd, &c),
        Resolved::Kernel => true,
        Resolved::NotYet => false,
    }
}

/// Milliseconds left of a poll-style timeout (negative: forever).
fn left_ms(timeout: c_int, start: std::time::Instant) -> c_int {
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
    // SAFETY: poll's contract: `fds` holds `nfds` valid entries.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let mut shm: Vec<(usize, Arc<Conn>)> = Vec::new();
    let mut pend: Vec<(usize, Arc<Pending>)> = Vec::new();
    for (i, p) in set.iter().enumerate() {
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
                }
            }
            _ => {}
        }
    }
    if shm.is_empty() && pend.is_empty() {
        return wait(fds, nfds, timeout);
    }
    // The relay sockets to watch: (the connection's place in `shm`, its
    // socket to the relay).
    let bells: Vec<(usize, c_int)> = shm
        .iter()
        .enumerate()
        .filter(|(_, (_, c))| c.bell() >= 0)
        .map(|(k, (_, c))| (k, c.bell()))
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
        let r = if bells.is_empty() {
            wait(fds, nfds, t)
        } else {
            // SAFETY: as above.
            let set = unsafe { std::slice::from_raw_parts(fds, nfds as usize) };
            with_bells.clear();
            with_bells.extend_from_slice(set);
            with_bells.extend(bells.iter().map(|&(_, bell)| pollfd {
                fd: bell,
                events: libc::POLLIN,
                revents: 0,
            }));
            wait(with_bells.as_mut_ptr(), with_bells.len() as nfds_t, t)
        };
        if r < 0 {
            return r;
        }
        // SAFETY: as above; the real poll wrote only `revents`.
        let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
        if !bells.is_empty() {
            for (p, w) in set.iter_mut().zip(&with_bells) {
                p.revents = w.revents;
            }
            for (k, &(shm_at, _)) in bells.iter().enumerate() {
                let rung = with_bells[set.len() + k].revents;
                let i = shm[shm_at].0;
                if rung & libc::POLLIN != 0 {
                    // A byte from the relay: `settle` below drains it and
                    // says whether the ring has something.
                    set[i].revents |= libc::POLLIN;
                } else if rung != 0 {
                    // The relay is gone, and the connection with it.
                    set[i].revents |= libc::POLLHUP;
                }
            }
        }
        for (i, c) in &shm {
            if set[*i].revents & libc::POLLIN != 0 && !settle(set[*i].fd, c) {
                set[*i].revents &= !(libc::POLLIN | libc::POLLRDNORM);
            }
            if c.has_error() {
                set[*i].revents |= libc::POLLERR;
            }
        }
        for (i, p) in &pend {
            if set[*i].revents & libc::POLLIN != 0 && !settle_pending(set[*i].fd, p) {
                set[*i].revents &= !(libc::POLLIN | libc::POLLRDNORM);
            }
        }
        for i in ready {
            set[i].revents |= libc::POLLIN;
        }
        let n = set.iter().filter(|p| p.revents != 0).count() as c_int;
        if n > 0 || t == 0 {
            return n;
        }
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
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::epoll_ctl()(epfd, op, fd, event) };
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
        set_errno(e);
    }
    r
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
    let (mut shm, pend) = table::epoll_entries(epfd);
    if !pend.is_empty() {
        for (fd, _, p) in &pend {
            // Records of the exchange already in are taken now, so a wait
            // never wakes for bytes that are not the program's.
            setup::resolve(*fd, p, false, true);
        }
        shm = table::epoll_entries(epfd).0;
    }
    if (shm.is_empty() && pend.is_empty()) || events.is_null() || max <= 0 {
        return wait(timeout);
    }
    let wants_in = |i: &Interest| i.events & libc::EPOLLIN as u32 != 0;
    let start = std::time::Instant::now();
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
        // SAFETY: `events` holds `max` entries, the first `n` written by the
        // kernel.
        let n = unsafe { settle_events(events, n as usize, max as usize, &shm, &pend, &ready) };
        if n > 0 || t == 0 {
            return n as c_int;
        }
    }
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
        if ev.events & libc::EPOLLIN as u32 != 0 {
            if let Some((fd, _, c)) = conn {
                if !settle(*fd, c) {
                    ev.events &= !((libc::EPOLLIN | libc::EPOLLRDNORM) as u32);
                }
            } else if let Some((fd, _, p)) = pend.iter().find(|(_, i, _)| i.data == data) {
                if !settle_pending(*fd, p) {
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

/// `setsockopt(2)`: see the module's notes on `TCP_NODELAY` and `TCP_CORK`.
///
/// # Safety
///
/// As for the C library's `setsockopt`.
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: socklen_t,
) -> c_int {
    if level == libc::IPPROTO_TCP
        && !value.is_null()
        && len as usize >= std::mem::size_of::<c_int>()
    {
        if let Some(Entry::Shm(c)) = table::get(fd) {
            // SAFETY: a non-null value of at least an int's size (the
            // option's type), valid for reads per setsockopt's contract.
            let on = unsafe { std::ptr::read_unaligned(value.cast::<c_int>()) } != 0;
            if c.set_tcp_option(name, on) {
                return 0;
            }
        }
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::setsockopt()(fd, level, name, value, len) }
}

/// `getsockopt(2)`: the recorded `TCP_NODELAY` and `TCP_CORK` of a
/// taken-over connection, the kernel's answer otherwise.
///
/// # Safety
///
/// As for the C library's `getsockopt`.
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if level == libc::IPPROTO_TCP && !value.is_null() && !len.is_null() {
        if let Some(Entry::Shm(c)) = table::get(fd) {
            if let Some(on) = c.tcp_option(name) {
                // SAFETY: `len` is valid (getsockopt's contract).
                if (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
                    return fail(libc::EINVAL) as c_int;
                }
                // SAFETY: `value` is valid for writes of `*len ≥ int` bytes.
                unsafe {
                    std::ptr::write_unaligned(value.cast::<c_int>(), c_int::from(on));
                    *len = std::mem::size_of::<c_int>() as socklen_t;
                }
                return 0;
            }
        }
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::getsockopt()(fd, level, name, value, len) }
}
