//! The kernel's socket diagnostics (`NETLINK_SOCK_DIAG`): who owns the TCP
//! socket at the other end of a connection on this host, and which socket
//! it is, as the kernel says it, never as the peer says it.

use crate::errno::errno;
use crate::real;
use libc::c_int;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use thiserror::Error;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// Bytes of `struct inet_diag_req_v2`.
const REQ_BYTES: usize = 56;
/// Bytes of `struct nlmsghdr`.
const NLMSG_HDR_BYTES: usize = 16;
/// Bytes of `struct inet_diag_msg`.
const MSG_BYTES: usize = 72;

/// Why the kernel's socket diagnostics named no owner.
#[derive(Debug, Error)]
pub(crate) enum DiagError {
    /// The kernel has no such connection.
    #[error("no such socket")]
    NoSuchSocket,
    /// No netlink socket for the diagnostics.
    #[error("the kernel's socket diagnostics: {0}")]
    Open(std::io::Error),
    /// The question could not be sent.
    #[error("asking the kernel's socket diagnostics: {0}")]
    Ask(std::io::Error),
    /// The answer could not be read.
    #[error("reading the kernel's socket diagnostics: {0}")]
    Read(std::io::Error),
    /// An answer shorter than a netlink header.
    #[error("a short answer from the kernel's socket diagnostics")]
    Short,
    /// The kernel answered with an error.
    #[error("the kernel's socket diagnostics: {0}")]
    Kernel(std::io::Error),
    /// An answer of another kind, or too short for its kind.
    #[error("an unexpected answer from the kernel's socket diagnostics")]
    Unexpected,
}

/// What the kernel says of a TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The user the socket belongs to (who made it).
    pub(crate) uid: u32,
    /// The socket's inode.
    pub(crate) inode: u64,
}

/// The TCP socket bound to `src` and connected to `dst` on this host
/// (network namespace), as the kernel knows it.
pub(crate) fn tcp_socket(src: (IpAddr, u16), dst: (IpAddr, u16)) -> Result<Owner, DiagError> {
    // An IPv4 peer may sit on an IPv4 socket or, mapped, on an IPv6 one.
    let tries: Vec<(c_int, [u8; 16], [u8; 16])> = match (src.0, dst.0) {
        (IpAddr::V4(s), IpAddr::V4(d)) => vec![
            (libc::AF_INET, v4_words(s.octets()), v4_words(d.octets())),
            (
                libc::AF_INET6,
                s.to_ipv6_mapped().octets(),
                d.to_ipv6_mapped().octets(),
            ),
        ],
        (s, d) => vec![(libc::AF_INET6, v6_of(s), v6_of(d))],
    };
    let mut last = DiagError::NoSuchSocket;
    for (family, s, d) in tries {
        match lookup(family, (s, src.1), (d, dst.1)) {
            Ok(Some(o)) => return Ok(o),
            Ok(None) => {}
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn v4_words(o: [u8; 4]) -> [u8; 16] {
    let mut w = [0u8; 16];
    w[..4].copy_from_slice(&o);
    w
}

fn v6_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// One exact lookup: Ok(None) when the kernel has no such socket.
fn lookup(
    family: c_int,
    src: ([u8; 16], u16),
    dst: ([u8; 16], u16),
) -> Result<Option<Owner>, DiagError> {
    // SAFETY: plain socket creation, owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(DiagError::Open(std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor nothing else owns; dropped with the C
    // library's close through `crate::unix::close`.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = [0u8; NLMSG_HDR_BYTES + REQ_BYTES];
    req[0..4].copy_from_slice(&((NLMSG_HDR_BYTES + REQ_BYTES) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    let r = &mut req[NLMSG_HDR_BYTES..];
    r[0] = family as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
    // The socket id: ports and addresses in network order, no interface,
    // no cookie.
    r[8..10].copy_from_slice(&src.1.to_be_bytes());
    r[10..12].copy_from_slice(&dst.1.to_be_bytes());
    r[12..28].copy_from_slice(&src.0);
    r[28..44].copy_from_slice(&dst.0);
    r[48..56].copy_from_slice(&[0xff; 8]);
    // SAFETY: `req` is valid for reads of its length.
    let sent = unsafe { real::send()(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent != req.len() as isize {
        let e = std::io::Error::last_os_error();
        crate::unix::close(sock);
        return Err(DiagError::Ask(e));
    }
    let mut buf = [0u8; 1024];
    let n = loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { real::recv()(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 || errno() != libc::EINTR {
            break n;
        }
    };
    crate::unix::close(sock);
    if n < 0 {
        return Err(DiagError::Read(std::io::Error::last_os_error()));
    }
    parse(&buf[..n as usize])
}

/// The owner in the kernel's answer; Ok(None) for "no such socket".
fn parse(b: &[u8]) -> Result<Option<Owner>, DiagError> {
    if b.len() < NLMSG_HDR_BYTES {
        return Err(DiagError::Short);
    }
    let word = |at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let kind = u16::from_ne_bytes([b[4], b[5]]);
    if kind == libc::NLMSG_ERROR as u16 {
        let e = i32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
        return if e == -libc::ENOENT || e == 0 {
            Ok(None)
        } else {
            Err(DiagError::Kernel(std::io::Error::from_raw_os_error(-e)))
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY || b.len() < NLMSG_HDR_BYTES + MSG_BYTES {
        return Err(DiagError::Unexpected);
    }
    let m = NLMSG_HDR_BYTES;
    Ok(Some(Owner {
        uid: word(m + 64),
        inode: u64::from(word(m + 68)),
    }))
}

/// The connection's two ends as the kernel reports them: (this end, the
/// peer), each an address and a port.
pub(crate) type Ends = ((IpAddr, u16), (IpAddr, u16));

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_kernel_names_the_owner_and_inode_of_a_loopback_peer() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let me = (c.local_addr().unwrap().ip(), c.local_addr().unwrap().port());
        let peer = (a.local_addr().unwrap().ip(), a.local_addr().unwrap().port());
        let o = tcp_socket(me, peer).unwrap();
        // SAFETY: geteuid cannot fail.
        assert_eq!(o.uid, unsafe { libc::geteuid() });
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
            .unwrap()
            .ino();
        assert_eq!(o.inode, ino);
        // No such connection.
        assert!(tcp_socket(me, (peer.0, 1)).is_err());
        assert!(matches!(
            lookup(libc::AF_INET, ([0; 16], 1), ([0; 16], 2)),
            Ok(None)
        ));
    }
}
