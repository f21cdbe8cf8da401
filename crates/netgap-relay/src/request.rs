//! A program's request as it comes on the relay's Unix socket: one
//! fixed-size record with the descriptors beside it, read with a time
//! limit, and the reply that goes back on the same socket.

use netgap_proto::direct::{DirectRequest, DIRECT_REQUEST_BYTES, DIRECT_REQUEST_MAGIC};
use netgap_proto::preload::{RelayReply, RelayRequest, RELAY_REQUEST_BYTES};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;
use thiserror::Error;

/// Why a client's request is not taken; the refusal's text is this one
/// line.
#[derive(Debug, Error)]
pub(crate) enum RequestError {
    /// Nothing within the wait.
    #[error("no request in time")]
    Late,
    /// The socket failed.
    #[error("recvmsg: {0}")]
    Recv(io::Error),
    /// Longer than a request, or more descriptors than fit.
    #[error("a request or its descriptors were cut")]
    Cut,
    /// Not a request.
    #[error("bad request: {0}")]
    Bad(netgap_proto::preload::HelloError),
    /// A listen or connect without exactly the region and the socket.
    #[error("{0} descriptors with the request, want 2")]
    Descriptors(usize),
    /// A direct request without exactly the TCP socket.
    #[error("{0} descriptors with the direct request, want 1")]
    DirectDescriptors(usize),
    /// A reservation followed by anything but its own connect.
    #[error("after a reservation, anything but its connect")]
    NotItsConnect,
    /// A reservation with descriptors.
    #[error("descriptors with a reservation")]
    ReserveWithDescriptors,
}

pub(crate) fn reply(fd: RawFd, r: &RelayReply) {
    let b = r.encode();
    // SAFETY: `b` is valid for reads of its length.
    let _ = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
}

/// What a client asks: a relayed connection's request, or a direct
/// connection's (told apart by their magic).
pub(crate) enum Asked {
    /// A listen, a reservation or a connect of a relayed connection.
    Relay(RelayRequest),
    /// A direct connection's request.
    Direct(DirectRequest),
}

/// The request and its two descriptors (the region, the TCP socket).
pub(crate) struct Request {
    pub(crate) req: RelayRequest,
    pub(crate) region: OwnedFd,
    pub(crate) tcp: OwnedFd,
}

/// Reads one request and the descriptors beside it, waiting at most
/// `wait`; Ok(None): the client closed without one (a library checking
/// that the relay runs, or giving up a reservation).
pub(crate) fn read_request(
    fd: RawFd,
    wait: Duration,
) -> Result<Option<(Asked, Vec<OwnedFd>)>, RequestError> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = wait.as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
        return Err(RequestError::Late);
    }
    let mut buf = [0u8; max_request_bytes() + 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for a few descriptors, so that too many are seen (and
    // closed), not cut.
    let mut control = [0u8; 128];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    // SAFETY: a complete msghdr over live buffers.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(RequestError::Recv(io::Error::last_os_error()));
    }
    // Every descriptor received is owned (and so closed) whatever
    // follows.
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the
    // CMSG macros over `msg`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
        return Err(RequestError::Cut);
    }
    let got = &buf[..n as usize];
    let req = if got.starts_with(&DIRECT_REQUEST_MAGIC) {
        Asked::Direct(DirectRequest::decode(got).map_err(RequestError::Bad)?)
    } else {
        Asked::Relay(RelayRequest::decode(got).map_err(RequestError::Bad)?)
    };
    Ok(Some((req, fds)))
}

/// The longer of the two requests' lengths.
const fn max_request_bytes() -> usize {
    if DIRECT_REQUEST_BYTES > RELAY_REQUEST_BYTES {
        DIRECT_REQUEST_BYTES
    } else {
        RELAY_REQUEST_BYTES
    }
}

/// A direct request must come with the TCP socket alone.
pub(crate) fn direct_fd(fds: Vec<OwnedFd>) -> Result<OwnedFd, RequestError> {
    let [tcp] =
        <[OwnedFd; 1]>::try_from(fds).map_err(|fds| RequestError::DirectDescriptors(fds.len()))?;
    Ok(tcp)
}

/// A request that must come with the region and the TCP socket.
pub(crate) fn with_fds(req: RelayRequest, fds: Vec<OwnedFd>) -> Result<Request, RequestError> {
    let [region, tcp] =
        <[OwnedFd; 2]>::try_from(fds).map_err(|fds| RequestError::Descriptors(fds.len()))?;
    Ok(Request { req, region, tcp })
}
