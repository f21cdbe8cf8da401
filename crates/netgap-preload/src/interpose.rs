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
//! blocking read; on a relayed connection its sending side ends through
//! the relays instead, behind the bytes they still carry. Socket options
//! go to the kernel socket too, except `TCP_NODELAY` and `TCP_CORK`, which are
//! recorded and not applied: the kernel socket then carries only
//! doorbells, which must never wait for Nagle or a cork. `fork` needs nothing either:
//! the channels are shared mappings the child inherits, and the rings keep
//! no index in private memory.

use crate::conn::Conn;
use crate::errno::{errno, set_errno, Errno};
use crate::inherit::sync_cloexec;
use crate::real;
use crate::setup::{self, Resolved};
use crate::table::{self, Entry, Leaving};
use libc::{c_int, c_ulong, c_void};
use libc::{sockaddr, socklen_t, ssize_t};
use std::sync::Arc;

pub mod data;
pub mod epoll;
pub mod poll;
#[cfg(feature = "xdp")]
mod poll_direct;
pub mod select;
#[cfg(feature = "xdp")]
mod select_direct;

/// Where a data call on a descriptor goes.
pub(crate) enum Route {
    /// The kernel socket (or any other file).
    Kernel,
    /// The shared-memory channel.
    Shm(Arc<Conn>),
    /// A pending connection with nothing in yet, read without blocking.
    Again,
    /// The connection's own AF_XDP socket.
    #[cfg(feature = "xdp")]
    Direct(Arc<crate::direct::Direct>),
}

pub(crate) fn route(fd: c_int, writing: bool) -> Route {
    route_with(fd, writing, false)
}

/// As [`route`]; `dontwait`: a read must not wait for a connector's
/// answer even on a blocking descriptor.
pub(crate) fn route_with(fd: c_int, writing: bool, dontwait: bool) -> Route {
    let entry = table::get(fd);
    // Whether a connector's offer is open is read once, before its direct
    // connection: the switch sets the direct connection first and ends the
    // offer after, so a reader that finds the offer ended also finds the
    // switch. (Read the other way round, a reader could find neither, take
    // the ring, and sleep on it for good.)
    let offered = matches!(&entry, Some(Entry::Shm(c)) if c.offered());
    // Found before the table's switch to the direct connection.
    #[cfg(feature = "xdp")]
    if let Some(d) = entry.as_ref().and_then(|e| match e {
        Entry::Shm(c) => c.went_direct(),
        _ => None,
    }) {
        return Route::Direct(d);
    }
    match entry {
        None | Some(Entry::Listener { .. } | Entry::Region(_)) => Route::Kernel,
        Some(Entry::Shm(c)) if offered => {
            // Writes go into the ring before the answer (see
            // `setup::connected`); a read needs the answer first, and so
            // does a blocking write to a relayed offer whose ring is full:
            // only the relay, once the answer came, makes room in it.
            let blocking = !dontwait && !c.nonblocking();
            let wait = blocking && (!writing || c.write_full() && c.offered_via_relay());
            match setup::finish_offer(fd, &c, wait) {
                Resolved::Shm(c) => Route::Shm(c),
                #[cfg(feature = "xdp")]
                Resolved::Direct(d) => Route::Direct(d),
                Resolved::Kernel => Route::Kernel,
                Resolved::NotYet if writing => Route::Shm(c),
                Resolved::NotYet => Route::Again,
            }
        }
        // A peer that closed for good gets the program's writes on the
        // kernel socket, which answers them as the kernel does.
        Some(Entry::Shm(c)) if writing && c.peer_closed_for_writes(fd) => Route::Kernel,
        Some(Entry::Shm(c)) => Route::Shm(c),
        #[cfg(feature = "xdp")]
        Some(Entry::Direct(d)) => Route::Direct(d),
        Some(Entry::Pending(p)) => match setup::resolve(fd, &p, writing, dontwait) {
            Resolved::Shm(c) => Route::Shm(c),
            #[cfg(feature = "xdp")]
            Resolved::Direct(d) => Route::Direct(d),
            Resolved::Kernel => Route::Kernel,
            Resolved::NotYet => Route::Again,
        },
    }
}

pub(crate) fn done(r: Result<usize, Errno>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

pub(crate) fn fail(e: Errno) -> ssize_t {
    set_errno(e);
    -1
}

/// `connect(2)`: to a listener with the library, on this host or (under
/// `-t xdp`) on another one through the relays, the connection is made
/// (blocking, even on a non-blocking socket: it takes the kernel's
/// handshake, microseconds on one host, a round trip across hosts) and
/// offered the channel, and `connect` returns without waiting for the
/// listener's answer; otherwise untouched.
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
    // The relay socket stays registered (with this descriptor's data)
    // wherever it was beside `fd` while another descriptor keeps the
    // connection: take it out, or its wake-ups would name a closed
    // descriptor's data.
    let taken = table::take_registered(fd, |e| Leaving {
        beside: relay_socket(e),
        itself: false,
    });
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

/// A relayed connection's socket to its relay, which the library
/// registers beside the connection's descriptor in the program's epolls
/// (`bell::register_bell`).
fn relay_socket(e: Option<&Entry>) -> Option<c_int> {
    match e {
        Some(Entry::Shm(c)) if c.bell() >= 0 => Some(c.bell()),
        _ => None,
    }
}

/// The relayed connection still offered that `fd` holds, if it does.
fn offered_via_relay(fd: c_int) -> Option<Arc<Conn>> {
    match table::get(fd) {
        Some(Entry::Shm(c)) if c.offered_via_relay() => Some(c),
        _ => None,
    }
}

/// The program closes `fd`, a descriptor of a relayed connection still
/// offered: the descriptor goes at once, as the kernel's close would, and
/// the offer's end goes on in the background (`setup::close_offered`).
/// None: the offer had ended, and the close goes the usual way.
fn close_offered(fd: c_int) -> Option<c_int> {
    let c = offered_via_relay(fd)?;
    let e = errno();
    let last = table::descriptors_of(&c).iter().all(|d| *d == fd);
    if !setup::close_offered(fd, &c) {
        set_errno(e);
        return None;
    }
    // The library's duplicate keeps the socket's file open, and with it
    // the program's registrations of `fd` (the kernel drops them with the
    // file's last descriptor): they go now, as the kernel's close of the
    // last descriptor would take them. The relay socket beside it goes
    // as `forget` takes it.
    let _ = table::take_registered(fd, |e| Leaving {
        beside: relay_socket(e),
        itself: last,
    });
    if !last {
        sync_cloexec(&c);
    }
    set_errno(e);
    // SAFETY: the program's own argument, passed on.
    Some(unsafe { real::close()(fd) })
}

/// `close(2)`: the last descriptor of a taken-over connection in this
/// process closes it as the kernel would (`Conn::last_close`).
///
/// # Safety
///
/// As for the C library's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(r) = close_offered(fd) {
        return r;
    }
    #[cfg(feature = "xdp")]
    settle_granting(fd);
    #[cfg(feature = "xdp")]
    if let Some(Entry::Direct(_)) = table::get(fd) {
        close_direct(fd);
        // SAFETY: the program's own argument, passed on.
        return unsafe { real::close()(fd) };
    }
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

/// The program closes an accepted connection whose direct grant is
/// awaited (`Pend::Granting`): an answer already in is taken first, so
/// that the close ends the connection on the path it took (a granted one
/// with its closing frame, a refused one as a relayed one), and the peer,
/// which may already be on its direct connection, sees the end at once as
/// the kernel's close would show it, not after its silence limit. With no
/// answer yet the request goes with the connection (its relay refuses it
/// and the connector falls back), with one line. Not when the connection
/// may live on in another descriptor or process (a dup, or a child forked
/// since): closing one descriptor does not end the connection.
#[cfg(feature = "xdp")]
fn settle_granting(fd: c_int) {
    let Some(Entry::Pending(p)) = table::get(fd) else {
        return;
    };
    // Settled only by the process that asked, before any fork: a child
    // may hold the connection too, and close its own descriptor later.
    let alone = p
        .granting
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|g| g.forks == crate::pid::forks());
    if !alone || table::pending_shared_elsewhere(fd, &p) {
        return;
    }
    let e = errno();
    if matches!(setup::resolve(fd, &p, false, true), Resolved::NotYet) {
        crate::log::log_line!(
            "fd {fd}: accepted connection closed while its direct grant was awaited: its relay refuses it"
        );
    }
    set_errno(e);
}

/// The program closes a descriptor of a direct connection: the last one
/// in this process ends it (its closing frame now, and the progress
/// thread's linger for its acknowledgment, at most `CLOSE_LINGER`, after
/// which the relay socket goes and with it the steering registration; in
/// a process that did not open it, nothing is sent). Returns at once.
#[cfg(feature = "xdp")]
fn close_direct(fd: c_int) {
    let e = errno();
    let taken = table::take_registered(fd, |e| Leaving {
        beside: match e {
            Some(Entry::Direct(d)) => Some(d.wait_fd()),
            _ => None,
        },
        itself: false,
    });
    if let Some(Entry::Direct(d)) = taken {
        if table::direct_shared_elsewhere(&d) {
            d.sync_cloexec(&table::direct_descriptors(&d));
        } else {
            d.closing(fd);
        }
        drop(d);
    }
    set_errno(e);
}

/// `shutdown(2)`: on a taken-over connection the peer's blocking sleepers
/// are woken to see the FIN; a relayed connection's end goes through the
/// relays instead (`shutdown_relayed`).
///
/// # Safety
///
/// As for the C library's `shutdown`.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(c) = offered_via_relay(fd) {
        if how != libc::SHUT_RD && how != libc::SHUT_WR && how != libc::SHUT_RDWR {
            return fail(libc::EINVAL) as c_int;
        }
        // The kernel socket's shutdown waits for the offer's end, after
        // the ring's bytes (`setup::shut_offered`).
        let e = errno();
        let deferred = setup::shut_offered(fd, &c, how);
        set_errno(e);
        if deferred {
            return 0;
        }
    }
    // A direct connection's end goes as its closing frame, after its
    // bytes; its kernel socket stays quiet until the close, so that the
    // peer's waits do not wake for a FIN that is not the connection's.
    #[cfg(feature = "xdp")]
    if let Some(Entry::Direct(d)) = table::get(fd) {
        if how != libc::SHUT_RD && how != libc::SHUT_WR && how != libc::SHUT_RDWR {
            return fail(libc::EINVAL) as c_int;
        }
        d.shut(how);
        return 0;
    }
    if let Some(Entry::Shm(c)) = table::get(fd) {
        if c.bell() >= 0 {
            return shutdown_relayed(fd, how, &c);
        }
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::shutdown()(fd, how) };
    if r == 0 {
        match table::get(fd) {
            Some(Entry::Shm(c)) => {
                let e = errno();
                c.shut(how);
                set_errno(e);
            }
            #[cfg(feature = "xdp")]
            Some(Entry::Direct(d)) => d.shut(how),
            _ => {}
        }
    }
    r
}

/// `shutdown` of a relayed connection: its end goes through the relays,
/// after its last bytes (`Conn::shut` marks the ring, and the relay
/// carries the end once it sent what the ring held). The kernel's FIN
/// would go at once and overtake those bytes: the kernel socket's sending
/// side stays open until the relay, the last to hold it, closes it.
/// Its receiving side is shut down as asked.
fn shutdown_relayed(fd: c_int, how: c_int, c: &Conn) -> c_int {
    if how != libc::SHUT_RD && how != libc::SHUT_WR && how != libc::SHUT_RDWR {
        return fail(libc::EINVAL) as c_int;
    }
    if how != libc::SHUT_WR {
        // SAFETY: the program's own descriptor.
        let r = unsafe { real::shutdown()(fd, libc::SHUT_RD) };
        if r != 0 {
            return r;
        }
    }
    let e = errno();
    c.shut(how);
    set_errno(e);
    0
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
    match table::get(fd) {
        Some(Entry::Shm(c)) => {
            let e = errno();
            sync_cloexec(&c);
            set_errno(e);
        }
        #[cfg(feature = "xdp")]
        Some(Entry::Direct(d)) => {
            let e = errno();
            d.sync_cloexec(&table::direct_descriptors(&d));
            set_errno(e);
        }
        _ => {}
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
        #[cfg(feature = "xdp")]
        Some(Entry::Direct(d)) => d.set_nonblocking(on),
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
        let readable = match route_with(fd, false, true) {
            Route::Shm(c) => Some(c.readable(fd)),
            #[cfg(feature = "xdp")]
            Route::Direct(d) => Some(d.readable_bytes(fd)),
            _ => None,
        };
        if let Some(readable) = readable {
            return match readable {
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
    #[cfg(feature = "xdp")]
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR && !value.is_null() && !len.is_null() {
        if let Some(Entry::Direct(d)) = table::get(fd) {
            // SAFETY: `len` is valid (getsockopt's contract).
            if (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
                return fail(libc::EINVAL) as c_int;
            }
            // SAFETY: `value` is valid for writes of `*len ≥ int` bytes.
            unsafe {
                std::ptr::write_unaligned(value.cast::<c_int>(), d.take_error());
                *len = std::mem::size_of::<c_int>() as socklen_t;
            }
            return 0;
        }
    }
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
