//! The C library's own definitions of the calls this library interposes,
//! found with `dlsym(RTLD_NEXT, name)`. Everything in this library that
//! needs one of those calls goes through here: calling `libc::read` from
//! inside the library would land on the library's own `read` again.

use libc::{c_int, c_ulong, c_void, epoll_event, fd_set, msghdr, nfds_t, off_t, pollfd};
use libc::{iovec, size_t, sockaddr, socklen_t, ssize_t, timeval};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks `name` (NUL-terminated) up in the objects loaded after this one;
/// aborts with one line on standard error if the C library lacks it, since
/// nothing sensible can be done without the real call.
fn lookup(name: &'static [u8]) -> usize {
    // SAFETY: `name` is a NUL-terminated string literal; RTLD_NEXT is a
    // valid pseudo-handle for a shared object loaded by the dynamic linker.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if p.is_null() {
        let msg = b"netgap-preload: the C library lacks a call this library needs\n";
        // SAFETY: writing a static buffer to standard error, then aborting.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p as usize
}

macro_rules! real_fn {
    ($(#[$doc:meta])* $name:ident, fn($($arg:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        pub(crate) fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
            static PTR: AtomicUsize = AtomicUsize::new(0);
            let mut p = PTR.load(Ordering::Relaxed);
            if p == 0 {
                p = lookup(concat!(stringify!($name), "\0").as_bytes());
                PTR.store(p, Ordering::Relaxed);
            }
            // SAFETY: `p` is the address dlsym gave for the C library's
            // function of this name, whose C prototype is the one spelled
            // here (see its manual page).
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
        }
    };
}

real_fn!(
    /// `read(2)`.
    read, fn(c_int, *mut c_void, size_t) -> ssize_t);
real_fn!(
    /// `write(2)`.
    write, fn(c_int, *const c_void, size_t) -> ssize_t);
real_fn!(
    /// `readv(2)`.
    readv, fn(c_int, *const iovec, c_int) -> ssize_t);
real_fn!(
    /// `writev(2)`.
    writev, fn(c_int, *const iovec, c_int) -> ssize_t);
real_fn!(
    /// `recv(2)`.
    recv, fn(c_int, *mut c_void, size_t, c_int) -> ssize_t);
real_fn!(
    /// `send(2)`.
    send, fn(c_int, *const c_void, size_t, c_int) -> ssize_t);
real_fn!(
    /// `recvfrom(2)`.
    recvfrom, fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t);
real_fn!(
    /// `sendto(2)`.
    sendto, fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t);
real_fn!(
    /// `recvmsg(2)`.
    recvmsg, fn(c_int, *mut msghdr, c_int) -> ssize_t);
real_fn!(
    /// `sendmsg(2)`.
    sendmsg, fn(c_int, *const msghdr, c_int) -> ssize_t);
real_fn!(
    /// `sendfile(2)`.
    sendfile, fn(c_int, c_int, *mut off_t, size_t) -> ssize_t);
real_fn!(
    /// `sendfile64`, glibc's name for the same call with a 64-bit offset.
    sendfile64, fn(c_int, c_int, *mut off_t, size_t) -> ssize_t);
real_fn!(
    /// `connect(2)`.
    connect, fn(c_int, *const sockaddr, socklen_t) -> c_int);
real_fn!(
    /// `listen(2)`.
    listen, fn(c_int, c_int) -> c_int);
real_fn!(
    /// `accept(2)`.
    accept, fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int);
real_fn!(
    /// `accept4(2)`.
    accept4, fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int);
real_fn!(
    /// `close(2)`.
    close, fn(c_int) -> c_int);
real_fn!(
    /// `dup(2)`.
    dup, fn(c_int) -> c_int);
real_fn!(
    /// `dup2(2)`.
    dup2, fn(c_int, c_int) -> c_int);
real_fn!(
    /// `dup3(2)`.
    dup3, fn(c_int, c_int, c_int) -> c_int);
real_fn!(
    /// `fcntl(2)` with one integer-sized argument (see the interposed
    /// `fcntl` for why that covers every command).
    fcntl, fn(c_int, c_int, c_ulong) -> c_int);
real_fn!(
    /// `fcntl64`, glibc's name for `fcntl` in programs built with 64-bit
    /// file offsets.
    fcntl64, fn(c_int, c_int, c_ulong) -> c_int);
real_fn!(
    /// `ioctl(2)` with one pointer-sized argument.
    ioctl, fn(c_int, c_ulong, c_ulong) -> c_int);
real_fn!(
    /// `poll(2)`.
    poll, fn(*mut pollfd, nfds_t, c_int) -> c_int);
real_fn!(
    /// `select(2)`.
    select, fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int);
real_fn!(
    /// `epoll_ctl(2)`.
    epoll_ctl, fn(c_int, c_int, c_int, *mut epoll_event) -> c_int);
real_fn!(
    /// `epoll_wait(2)`.
    epoll_wait, fn(c_int, *mut epoll_event, c_int, c_int) -> c_int);
real_fn!(
    /// `epoll_pwait(2)`.
    epoll_pwait, fn(c_int, *mut epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int);
real_fn!(
    /// `setsockopt(2)`.
    setsockopt, fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int);
real_fn!(
    /// `getsockopt(2)`.
    getsockopt, fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int);
real_fn!(
    /// `ppoll(2)`.
    ppoll, fn(*mut pollfd, nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int);
real_fn!(
    /// `setuid(2)`.
    setuid, fn(libc::uid_t) -> c_int);
real_fn!(
    /// `setreuid(2)`.
    setreuid, fn(libc::uid_t, libc::uid_t) -> c_int);
real_fn!(
    /// `setresuid(2)`.
    setresuid, fn(libc::uid_t, libc::uid_t, libc::uid_t) -> c_int);
real_fn!(
    /// `shutdown(2)`.
    shutdown, fn(c_int, c_int) -> c_int);
