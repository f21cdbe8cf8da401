//! Abstract Unix sockets of the library's own: the beacons, the
//! connections' mailboxes and the socket to the host's relay. Each is a
//! `SOCK_SEQPACKET` socket, non-blocking and closed on exec, so that the
//! kernel vouches for the other end (`SO_PEERCRED`: the credentials of the
//! process that called `listen`, or `connect`) before a byte of it is read.
//!
//! Descriptors travel only to a socket that turned `SO_PASSRIGHTS` on after
//! checking its peer (Linux 6.16; before it, the option is refused and a
//! socket takes descriptors from its peer regardless, which is why the
//! peer is checked first and anything received that is not asked for is
//! disposed of without blocking, see [`dispose`]).

use crate::errno::{errno, Errno};
use crate::real;
use libc::c_int;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

/// `SO_PASSRIGHTS` (Linux 6.16): whether a socket accepts descriptors.
const SO_PASSRIGHTS: c_int = 83;

/// The lowest number the library moves its own descriptors to
/// ([`lift`]). The kernel numbers a process's descriptors from the
/// lowest free one, and programs size their tables by that numbering
/// (wrk's event loop holds descriptors below 10 plus three per
/// connection): the library's sockets, memfds and eventfds kept beside a
/// connection would otherwise push the program's own above where it
/// sized for. Below 1024 all the same, where `select` reaches: a relayed
/// connection's socket to its relay is watched in the program's `select`
/// beside the connection.
pub(crate) fn lift_floor() -> c_int {
    static FLOOR: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        // SAFETY: all-zero bytes are a valid rlimit, filled by the call.
        let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: a valid rlimit to write.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            r.rlim_cur
        } else {
            1024
        };
        c_int::try_from(soft / 2).unwrap_or(512).clamp(3, 512)
    })
}

/// Moves `fd`, a descriptor of the library's own, to the lowest free
/// number at or above the floor (see [`lift_floor`]), keeping its
/// close-on-exec flag; `fd` stays as it is when no number there is free.
/// The caller's errno is kept.
pub(crate) fn lift(fd: OwnedFd) -> OwnedFd {
    let raw = fd.as_raw_fd();
    let floor = lift_floor();
    if raw >= floor {
        return fd;
    }
    let e = errno();
    // SAFETY: plain fcntl calls on our own descriptor; `fcntl` is
    // interposed, so the real one is called.
    let cloexec = unsafe { real::fcntl()(raw, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: as above.
    let high = unsafe { real::fcntl()(raw, cmd, floor as libc::c_ulong) };
    crate::errno::set_errno(e);
    if high < 0 {
        return fd;
    }
    close(fd);
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(high) }
}

/// A fresh non-blocking, close-on-exec eventfd of the library's own,
/// above the program's numbers ([`lift`]).
pub(crate) fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: a plain eventfd call with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(lift(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A fresh close-on-exec epoll of the library's own, above the program's
/// numbers ([`lift`]).
#[cfg(feature = "xdp")]
pub(crate) fn epoll() -> std::io::Result<OwnedFd> {
    // SAFETY: a plain epoll_create1 call with a valid flag.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(lift(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The calling process's effective user.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// An abstract socket address for `name` (without its leading NUL).
fn abstract_addr(name: &str) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.len() + 1 > a.sun_path.len() {
        return None;
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays NUL: the abstract namespace.
    for (d, s) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Some((a, len as libc::socklen_t))
}

/// A fresh `SOCK_SEQPACKET` Unix socket, non-blocking and closed on exec,
/// taking no descriptors (where the kernel knows how to refuse them).
pub(crate) fn seqpacket() -> Result<OwnedFd, Errno> {
    // SAFETY: plain socket creation; `socket` is not interposed.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = lift(unsafe { OwnedFd::from_raw_fd(fd) });
    // Refused by kernels before 6.16: then the peer is checked before
    // anything is read, and whatever comes unasked is disposed of.
    let _ = pass_rights(fd.as_raw_fd(), false);
    Ok(fd)
}

/// Turns the taking of descriptors on `fd` on or off; Err where the
/// kernel has no such switch.
pub(crate) fn pass_rights(fd: RawFd, on: bool) -> Result<(), Errno> {
    let v = c_int::from(on);
    // SAFETY: `v` is valid for reads of its size.
    let r = unsafe {
        real::setsockopt()(
            fd,
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Binds `fd` to the abstract `name` and listens with room for `backlog`
/// connections. Err(EADDRINUSE): the name is taken.
pub(crate) fn listen_at(fd: RawFd, name: &str, backlog: c_int) -> Result<(), Errno> {
    let (a, len) = abstract_addr(name).ok_or(libc::ENAMETOOLONG)?;
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    if unsafe { libc::bind(fd, std::ptr::from_ref(&a).cast(), len) } != 0 {
        return Err(errno());
    }
    // SAFETY: a plain listen on our socket; `listen` is interposed, so the
    // real one is called.
    if unsafe { real::listen()(fd, backlog) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Connects `fd` to the abstract `name` without waiting. Err(ECONNREFUSED):
/// nothing listens there; Err(EAGAIN): its backlog is full.
pub(crate) fn connect_to(fd: RawFd, name: &str) -> Result<(), Errno> {
    let (a, len) = abstract_addr(name).ok_or(libc::ENAMETOOLONG)?;
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes; `connect` is
    // interposed, so the real one is called.
    if unsafe { real::connect()(fd, std::ptr::from_ref(&a).cast(), len) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// The credentials the kernel holds for the other end of `fd`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cred {
    /// As this process's PID namespace sees it: 0 for a process outside.
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

/// `SO_PEERCRED` of `fd`.
pub(crate) fn peer_cred(fd: RawFd) -> Option<Cred> {
    // SAFETY: all-zero bytes are a valid ucred.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut c).cast(),
            &mut len,
        )
    };
    // No credentials read as uid -1; a pid of 0 is a process outside this
    // one's PID namespace, whose uid still counts.
    (r == 0 && c.uid != u32::MAX).then_some(Cred {
        pid: c.pid,
        uid: c.uid,
    })
}

/// Accepts one waiting connection on the listening `fd`, non-blocking and
/// closed on exec; None when none waits.
pub(crate) fn accept_one(fd: RawFd) -> Option<OwnedFd> {
    loop {
        // SAFETY: accept on our listening socket; the result is owned at
        // once. `accept4` is interposed, so the real one is called.
        let c = unsafe {
            real::accept4()(
                fd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if c >= 0 {
            // SAFETY: a new descriptor nothing else owns.
            return Some(unsafe { OwnedFd::from_raw_fd(c) });
        }
        if errno() != libc::EINTR {
            return None;
        }
    }
}

/// Most descriptors taken from one message: room for more than the one a
/// record carries, so that extra ones are seen (and disposed of), not
/// left to the kernel.
const MAX_FDS: usize = 8;

/// One record received on `fd` without waiting: its bytes (at most
/// `buf.len()`; a longer one is an error) and the descriptors beside it.
pub(crate) fn recv_record(fd: RawFd, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), Errno> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<c_int>()) as u32) } as usize;
    let n = loop {
        // SAFETY: a complete msghdr over live buffers; `recvmsg` is
        // interposed, so the real one is called.
        let n =
            unsafe { real::recvmsg()(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 || errno() != libc::EINTR {
            break n;
        }
    };
    if n < 0 {
        return Err(errno());
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the CMSG
    // macros over `msg`; every descriptor found is owned at once, so it is
    // closed whatever follows.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<c_int>() {
                    let fd = std::ptr::read_unaligned(data.cast::<c_int>().add(i));
                    fds.push(lift(OwnedFd::from_raw_fd(fd)));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        fds.into_iter().for_each(dispose);
        return Err(libc::EMSGSIZE);
    }
    Ok((n as usize, fds))
}

/// Closes a descriptor a peer sent without blocking on it: a socket is
/// closed with a zero linger first (a TCP socket with unsent data would
/// otherwise keep `close` waiting for as long as its linger says).
pub(crate) fn dispose(fd: OwnedFd) {
    // SAFETY: all-zero bytes are a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    let ok = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0;
    if ok && st.st_mode & libc::S_IFMT == libc::S_IFSOCK {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: `l` is valid for reads of its size; a failure leaves the
        // socket's own linger, nothing worse.
        unsafe {
            real::setsockopt()(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                std::ptr::from_ref(&l).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }
    close(fd);
}

/// Closes a descriptor of the library's own with the C library's `close`
/// (dropping an `OwnedFd` would go through the library's own, which looks
/// the number up in its table first).
pub(crate) fn close(fd: OwnedFd) {
    // SAFETY: the descriptor is owned here and closed once.
    unsafe { real::close()(fd.into_raw_fd()) };
}

/// Random bytes from the kernel.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], Errno> {
    let mut k = [0u8; N];
    let mut off = 0;
    while off < N {
        // SAFETY: `k[off..]` is valid for writes of its length.
        let r = unsafe { libc::getrandom(k[off..].as_mut_ptr().cast(), N - off, 0) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        off += r as usize;
    }
    Ok(k)
}

#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
#[cfg(test)]
mod tests {
    use super::*;

    fn cloexec(fd: &OwnedFd) -> bool {
        // SAFETY: a plain fcntl on an open descriptor.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
    }

    #[test]
    fn a_lifted_descriptor_moves_above_the_programs_numbers_and_keeps_its_close_on_exec() {
        for flags in [libc::EFD_CLOEXEC, 0] {
            // SAFETY: a plain eventfd call.
            let raw = unsafe { libc::eventfd(0, flags) };
            assert!(raw >= 0);
            // SAFETY: a new descriptor nothing else owns.
            let low = unsafe { OwnedFd::from_raw_fd(raw) };
            let was = cloexec(&low);
            let high = lift(low);
            assert!(high.as_raw_fd() >= lift_floor(), "{}", high.as_raw_fd());
            assert!(lift_floor() <= 512);
            assert_eq!(cloexec(&high), was);
        }
    }
}
