//! The data calls: `read`, `write` and their vector, `recv`/`send`,
//! `msg` and `sendfile` forms, routed by the descriptor's entry: straight
//! to the C library, through a taken-over connection's channel, or after
//! resolving a pending connection.

use super::{done, fail, route, route_with, Route};
use crate::conn::{Conn, Sent};
#[cfg(feature = "xdp")]
use crate::direct::Direct;
use crate::errno::Errno;
use crate::log::log_line;
use crate::real;
use libc::{c_int, c_void, iovec, msghdr, off_t};
use libc::{size_t, sockaddr, socklen_t, ssize_t};

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

/// What a send returns that moved `sent` bytes into the ring before the
/// rest went elsewhere with result `r`: the bytes moved, or `r`'s error
/// when none were.
fn after(sent: usize, r: ssize_t) -> ssize_t {
    if r < 0 && sent > 0 {
        sent as ssize_t
    } else if r < 0 {
        r
    } else {
        (sent + r as usize) as ssize_t
    }
}

/// Sends `iov` on the kernel socket `fd`, as the program asked.
fn kernel_send(fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    // SAFETY: a zeroed msghdr is valid; only its buffers are set, to the
    // program's iovecs, valid for reads of their lengths (the caller's
    // contract).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` as set above.
    unsafe { real::sendmsg()(fd, &msg, flags) }
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
            // The offer went direct while this write waited for the ring:
            // the rest is the direct connection's, after the ring's bytes.
            #[cfg(feature = "xdp")]
            Ok(Sent::Direct(d)) => {
                return after(sent, direct_send(&d, fd, now, flags));
            }
            // The offer was refused while this write waited for the ring:
            // the rest goes to the kernel socket, after the ring's bytes.
            Ok(Sent::Kernel) => {
                return after(sent, kernel_send(fd, now, flags));
            }
            Ok(Sent::Bytes(n)) => {
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
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            let iov = [iovec {
                iov_base: buf,
                iov_len: count,
            }];
            // SAFETY: `buf` is valid for writes of `count` bytes (read's
            // contract).
            unsafe { direct_recv(&d, fd, &iov, 0) }
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::write()(fd, buf, count) },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: count,
            }];
            shm_send(&c, fd, &iov, 0)
        }
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: count,
            }];
            direct_send(&d, fd, &iov, 0)
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
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            if iov.is_null() || iovcnt < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: readv's contract: `iov` holds `iovcnt` valid iovecs.
            let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            // SAFETY: each iovec is valid for writes (readv's contract).
            unsafe { direct_recv(&d, fd, v, 0) }
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::writev()(fd, iov, iovcnt) },
        Route::Shm(c) => {
            if iov.is_null() || iovcnt < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: writev's contract: `iov` holds `iovcnt` valid iovecs.
            let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            shm_send(&c, fd, v, 0)
        }
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            if iov.is_null() || iovcnt < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: writev's contract: `iov` holds `iovcnt` valid iovecs.
            let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            direct_send(&d, fd, v, 0)
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
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            let iov = [iovec {
                iov_base: buf,
                iov_len: len,
            }];
            // SAFETY: `buf` is valid for writes of `len` bytes.
            unsafe { direct_recv(&d, fd, &iov, flags) }
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::send()(fd, buf, len, flags) },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            shm_send(&c, fd, &iov, flags)
        }
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            direct_send(&d, fd, &iov, flags)
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
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            if !addrlen.is_null() {
                // SAFETY: a non-null `addrlen` is valid for writes.
                unsafe { *addrlen = 0 };
            }
            let iov = [iovec {
                iov_base: buf,
                iov_len: len,
            }];
            // SAFETY: `buf` is valid for writes of `len` bytes.
            unsafe { direct_recv(&d, fd, &iov, flags) }
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::sendto()(fd, buf, len, flags, addr, addrlen) },
        Route::Shm(c) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            shm_send(&c, fd, &iov, flags)
        }
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            let iov = [iovec {
                iov_base: buf.cast_mut(),
                iov_len: len,
            }];
            direct_send(&d, fd, &iov, flags)
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
        #[cfg(feature = "xdp")]
        Route::Direct(d) => {
            if msg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: recvmsg's contract: `msg` and its iovecs are valid.
            unsafe {
                (*msg).msg_namelen = 0;
                (*msg).msg_controllen = 0;
                (*msg).msg_flags = 0;
                direct_recv(&d, fd, msg_iov(msg), flags)
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::sendmsg()(fd, msg, flags) },
        // SAFETY: sendmsg's contract: `msg` null or valid, with its iovecs.
        Route::Shm(c) => match unsafe { sendmsg_data(fd, msg, "shm") } {
            Ok(iov) => shm_send(&c, fd, iov, flags),
            Err(e) => fail(e),
        },
        #[cfg(feature = "xdp")]
        // SAFETY: sendmsg's contract: `msg` null or valid, with its iovecs.
        Route::Direct(d) => match unsafe { sendmsg_data(fd, msg, "direct") } {
            Ok(iov) => direct_send(&d, fd, iov, flags),
            Err(e) => fail(e),
        },
    }
}

/// The data of a `sendmsg` on a connection of the library's `path`
/// ("shm", "direct"): its iovecs, or `EFAULT` for a null message. Neither
/// path carries ancillary data, so any is dropped, with a log line saying
/// so.
///
/// # Safety
///
/// `msg` null, or valid with its iovecs (sendmsg's contract).
unsafe fn sendmsg_data<'a>(
    fd: c_int,
    msg: *const msghdr,
    path: &str,
) -> Result<&'a [iovec], Errno> {
    if msg.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract, and `msg` is not null.
    let (iov, control) = unsafe { (msg_iov(msg), (*msg).msg_controllen) };
    if control != 0 {
        log_line!(
            "fd {fd}: sendmsg with ancillary data on a {path} connection: the data is dropped"
        );
    }
    Ok(iov)
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::sendfile()(out, in_fd, offset, count) },
        // SAFETY: sendfile's contract on `offset`.
        Route::Shm(c) => unsafe { shm_sendfile(&c, out, in_fd, offset, count) },
        #[cfg(feature = "xdp")]
        // SAFETY: sendfile's contract on `offset`.
        Route::Direct(d) => unsafe { direct_sendfile(&d, out, in_fd, offset, count) },
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
        // Not moved yet: the bytes must not go on the kernel's TCP.
        Route::Again => fail(libc::EAGAIN),
        // SAFETY: the program's own arguments, passed on.
        Route::Kernel => unsafe { real::sendfile64()(out, in_fd, offset, count) },
        // SAFETY: sendfile's contract on `offset`.
        Route::Shm(c) => unsafe { shm_sendfile(&c, out, in_fd, offset, count) },
        #[cfg(feature = "xdp")]
        // SAFETY: sendfile's contract on `offset`.
        Route::Direct(d) => unsafe { direct_sendfile(&d, out, in_fd, offset, count) },
    }
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
    match c.sendfile(out, in_fd, off, count) {
        Ok(Sent::Bytes(n)) => n as ssize_t,
        // The offer was refused while this call waited for the ring.
        // SAFETY: `offset` as the caller gave it (sendfile's contract).
        Ok(Sent::Kernel) => unsafe { real::sendfile()(out, in_fd, offset, count) },
        // The offer went direct while this call waited for the ring.
        #[cfg(feature = "xdp")]
        // SAFETY: as above.
        Ok(Sent::Direct(d)) => unsafe { direct_sendfile(&d, out, in_fd, offset, count) },
        Err(e) => fail(e),
    }
}

/// Receives on a direct connection; refuses `MSG_OOB`.
///
/// # Safety
///
/// Every iovec valid for writes of its length.
#[cfg(feature = "xdp")]
unsafe fn direct_recv(d: &Direct, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    if flags & libc::MSG_OOB != 0 {
        log_line!("fd {fd}: recv with MSG_OOB on a direct connection is not supported (EINVAL)");
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    done(unsafe { d.recv(fd, iov, flags) })
}

/// Sends on a direct connection as the kernel sends; EPIPE raises SIGPIPE
/// unless the flags say not to.
#[cfg(feature = "xdp")]
fn direct_send(d: &Direct, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    if flags & libc::MSG_OOB != 0 {
        log_line!(
            "fd {fd}: send with MSG_OOB on a direct connection is not supported (EOPNOTSUPP)"
        );
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the program's iovecs, valid for reads of their lengths (the
    // interposed call's contract).
    let r = unsafe { d.send(fd, iov, flags) };
    if r == Err(libc::EPIPE) && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raise has no preconditions; the kernel sends the
        // writing thread SIGPIPE on a broken connection.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    done(r)
}

/// `sendfile` to a direct connection: the file is read into a buffer and
/// sent from it, as much as a `send` of the same bytes would take.
///
/// # Safety
///
/// `offset` null or valid for reads and writes.
#[cfg(feature = "xdp")]
unsafe fn direct_sendfile(
    d: &Direct,
    out: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    let mut buf = vec![0u8; count.min(DIRECT_SENDFILE_BYTES)];
    // SAFETY: a non-null `offset` is valid (sendfile's contract).
    let off = unsafe { offset.as_mut() };
    let got = match &off {
        // SAFETY: `buf` is valid for writes of its length.
        Some(o) => unsafe { libc::pread(in_fd, buf.as_mut_ptr().cast(), buf.len(), **o) },
        // SAFETY: as above.
        None => unsafe { libc::read(in_fd, buf.as_mut_ptr().cast(), buf.len()) },
    };
    if got <= 0 {
        return got;
    }
    let iov = [iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: got as usize,
    }];
    let sent = direct_send(d, out, &iov, 0);
    if sent > 0 {
        match off {
            Some(o) => *o += sent as off_t,
            // The file's offset moved by what was read: give back what
            // was not sent.
            None if sent < got => {
                // SAFETY: a plain lseek on the program's file.
                unsafe { libc::lseek(in_fd, (sent - got) as off_t, libc::SEEK_CUR) };
            }
            None => {}
        }
    } else if off.is_none() {
        // SAFETY: as above.
        unsafe { libc::lseek(in_fd, -(got as off_t), libc::SEEK_CUR) };
    }
    sent
}

/// Bytes one `sendfile` to a direct connection moves at most (what its
/// window takes in a burst).
#[cfg(feature = "xdp")]
const DIRECT_SENDFILE_BYTES: usize = 256 << 10;
