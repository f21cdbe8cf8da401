//! The few system calls the `shm` transport makes beyond the channel's own
//! (`netgap_shm`: the mapping, futex wait and wake), each wrapped so the
//! rest of the module stays free of `unsafe`: passing the memfd over the
//! rendezvous socket (SCM_RIGHTS), and non-blocking checks of that socket
//! for the peer's hang-up. None of them is on the data path of a flow that
//! makes progress.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Sends `hello` with `fd` attached (SCM_RIGHTS) over `sock`.
pub(crate) fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, hello: &[u8]) -> io::Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(hello)];
    let n = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(
        |e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("sendmsg(SCM_RIGHTS): {e}"),
            )
        },
    )?;
    if n != hello.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sendmsg(SCM_RIGHTS) sent {n} of {} bytes", hello.len()),
        ));
    }
    Ok(())
}

/// Receives the greeting sent by [`send_fd`] and the one descriptor
/// attached to it. The greeting must equal `hello`; any extra descriptors
/// are closed and make it an error.
pub(crate) fn recv_fd(sock: &UnixStream, hello: &[u8]) -> io::Result<OwnedFd> {
    let mut got = vec![0u8; hello.len()];
    let mut fds: Vec<OwnedFd> = Vec::new();
    let (n, truncated) = {
        let mut iov = [IoSliceMut::new(&mut got)];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        // A signal delivered to this thread (a child ending, the
        // terminal resized) interrupts the wait; nothing was received
        // then, so it is waited for again.
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        }
        .map_err(|e| {
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("recvmsg(SCM_RIGHTS): {e}"))
        })?;
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for r in raw {
                        // SAFETY: the kernel just installed `r` in this
                        // process for us (SCM_RIGHTS) and nothing else owns
                        // it; wrapping it at once closes it on every path.
                        fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                    }
                }
            }
        }
        (msg.bytes, truncated)
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the listener closed the rendezvous socket before sending the memfd",
        ));
    }
    if n < hello.len() {
        (&*sock).read_exact(&mut got[n..]).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("reading the rest of the shm greeting: {e}"),
            )
        })?;
    }
    if got != hello {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer's greeting {got:?} is not the shm greeting {hello:?}"),
        ));
    }
    if truncated || fds.len() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected exactly one memfd with the shm greeting, got {}{}",
                fds.len(),
                if truncated {
                    " (control data truncated)"
                } else {
                    ""
                }
            ),
        ));
    }
    fds.pop()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no memfd received"))
}

/// `poll(2)` on one descriptor for `events`, waiting at most `timeout_ms`
/// milliseconds (0: do not wait); returns the events that occurred.
fn poll_one(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one valid pollfd on this stack frame, and the
        // count passed is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r >= 0 {
            return Ok(if r == 0 { 0 } else { pfd.revents });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether the peer of `sock` has closed or shut down its end; never
/// blocks. Data the peer may have written is ignored (`POLLIN` is not
/// asked for), so a chatty peer cannot pass for a dead one.
pub(crate) fn peer_hung_up(sock: &UnixStream) -> io::Result<bool> {
    let ev = poll_one(sock.as_fd(), libc::POLLRDHUP, 0)
        .map_err(|e| io::Error::new(e.kind(), format!("poll on the shm liveness socket: {e}")))?;
    if ev & libc::POLLNVAL != 0 {
        return Err(io::Error::other(
            "the shm liveness socket is not open (POLLNVAL)",
        ));
    }
    Ok(ev & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

/// Waits until `fd` is readable (a listener: a connection is pending);
/// `Ok(false)` when `timeout` passes first.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        // Round up so a sub-millisecond remainder still waits.
        let ms = libc::c_int::try_from(left.as_millis() + 1).unwrap_or(libc::c_int::MAX);
        if poll_one(fd, libc::POLLIN, ms)? != 0 {
            return Ok(true);
        }
    }
}
