//! Connections to other hosts, through the host's relay (`netgap relay`).
//!
//! An unprivileged program cannot open AF_XDP sockets, and one such socket
//! per interface queue cannot serve many processes, so a root process per
//! host, the relay, owns the xdp side: the library shares a region (the
//! same ring pair as a same-host connection) with its host's relay, and
//! the two hosts' relays carry the connection's bytes over one xdp
//! reliable flow. The relay listens on the abstract Unix socket
//! `netgap-relay`, private to the network namespace like the ports.
//!
//! - A connector whose destination is not on this host, with a relay
//!   present, first asks the other host's relay (a UDP probe to its port
//!   7472) whether a program under the library listens on the port; only
//!   then, so a server without the library never reads a byte of it, it
//!   sends a hello saying "xdp via relay" with a random flow key
//!   once the TCP connection is up, and `connect` returns: the connection
//!   is offered, as a same-host one is, its writes filling the ring. The
//!   answer is read later (`setup::finish_offer`): a listener whose host
//!   runs a relay answers the target its relay listens at; the connector
//!   then hands its region and its TCP socket to its own relay
//!   ([`answered`]), which opens the flow to that target with the key.
//! - A listener with the library takes such a hello by handing its region
//!   and socket to its relay, which listens and says where.
//!
//! The ring's far end is the relay: the program's doorbells go to the
//! relay's socket (`Conn::with_bell`). Where the program waits in an
//! epoll, that socket is registered in it beside the connection, with the
//! program's data (`interpose::register_bell`), and the relay wakes the
//! program with a byte on it, on this host; a wait in poll or select
//! watches it too (`interpose::shm_poll`, `select_with_bells`). Where it
//! cannot be watched, the wait is woken by the other host's relay sending
//! a byte on the TCP connection, the only other thing that makes the
//! program's descriptor readable. The relay
//! also holds a duplicate of the TCP socket, so the kernel sends the FIN
//! only once the relay has delivered every byte.
//!
//! No relay, or a refusal: the connection stays on the kernel's TCP, with
//! one line in the log.

use crate::conn::{Conn, OfferPath, RelayOffer};
use crate::errno::{errno, Errno};
use crate::exchange::{ring_bytes, NotMoved};
use crate::log::log_line;
use crate::real;
use crate::table::{self, Entry};
use libc::c_int;
use netgap_proto::preload::{
    Hello, Probe, ProbeAnswer, Refusal, RelayReply, RelayRequest, PROBE_BYTES, PROBE_PORT,
    RELAY_KEY_BYTES, RELAY_REPLY_BYTES,
};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::Arc;
use thiserror::Error;

/// Why this host's relay cannot carry a connection (it stays on the
/// kernel's TCP, or, once its hello went out, is reset).
#[derive(Debug, Error)]
pub(crate) enum RelayError {
    /// The library runs under another stack than xdp.
    #[error("connections to other hosts move only under -t xdp")]
    NotXdp,
    /// No socket to reach the relay.
    #[error("no socket for the relay: {0}")]
    NoSocket(std::io::Error),
    /// Nothing listens at the relay's name.
    #[error("no relay runs here")]
    NoRelay,
    /// The relay's socket could not be reached.
    #[error("the relay @{RELAY_SOCKET}: {0}")]
    Connect(std::io::Error),
    /// Another user than root holds the relay's name.
    #[error("the relay @{RELAY_SOCKET} is uid {uid}'s (pid {pid}), not root's: a squatter")]
    Squatter {
        /// The holder's uid.
        uid: u32,
        /// The holder's pid.
        pid: i32,
    },
    /// The kernel gave no credentials of the relay.
    #[error("the relay @{RELAY_SOCKET} has no credentials")]
    NoCredentials,
    /// The request could not be sent.
    #[error("sending the request to the relay: {0}")]
    Send(std::io::Error),
    /// No reply within the wait.
    #[error("the relay did not reply in time")]
    Late,
    /// The relay closed its socket.
    #[error("the relay closed without replying")]
    Closed,
    /// Not a reply.
    #[error("the relay's reply: {0}")]
    Reply(netgap_proto::preload::HelloError),
    /// No connection key.
    #[error("no random bytes for a connection key: {0}")]
    NoKey(std::io::Error),
    /// The relay refused the reservation, with its reason.
    #[error("the relay here refused: {0}")]
    Refused(String),
}

/// Why the other host's relay did not say whether a program under the
/// library listens there.
#[derive(Debug, Error)]
enum ProbeError {
    /// The destination is no IP address.
    #[error("not an IP destination")]
    NotIp,
    /// No nonce.
    #[error("no random bytes for the probe")]
    NoNonce,
    /// No UDP socket.
    #[error("the probe's socket: {0}")]
    Socket(std::io::Error),
    /// The probe could not be sent or its answer read.
    #[error("the probe: {0}")]
    Io(std::io::Error),
    /// No answer within the wait.
    #[error("no relay answered on the peer's host within {PROBE_WAIT_MS} ms")]
    NoAnswer,
    /// The other host refused the datagram: no relay there.
    #[error("no relay runs on the peer's host")]
    NoRelay,
}

/// The relay's abstract socket name (without the leading NUL).
pub(crate) const RELAY_SOCKET: &str = "netgap-relay";
/// How long the library waits for its relay's reply (a connect opens an
/// xdp flow, up to the transport's own 3 s, plus a busy queue's wait).
const REPLY_WAIT_MS: c_int = 10_000;

/// A connected socket to the relay (blocking: the library waits for its
/// replies, bounded), or why not: the library asks the relay only under
/// `-t xdp`, and only a relay the kernel says is root's (`SO_PEERCRED`):
/// anyone can bind the name, and a squatter would be handed the
/// program's connections.
pub(crate) fn open() -> Result<c_int, RelayError> {
    if crate::settings().stack != crate::Stack::Xdp {
        return Err(RelayError::NotXdp);
    }
    let fd = crate::unix::seqpacket()
        .map_err(|e| RelayError::NoSocket(std::io::Error::from_raw_os_error(e)))?;
    match crate::unix::connect_to(fd.as_raw_fd(), RELAY_SOCKET) {
        Ok(()) => {}
        Err(libc::ECONNREFUSED | libc::ENOENT) => {
            crate::unix::close(fd);
            return Err(RelayError::NoRelay);
        }
        Err(e) => {
            crate::unix::close(fd);
            return Err(RelayError::Connect(std::io::Error::from_raw_os_error(e)));
        }
    }
    match crate::unix::peer_cred(fd.as_raw_fd()) {
        Some(c) if c.uid == 0 => {}
        Some(c) => {
            crate::unix::close(fd);
            return Err(RelayError::Squatter {
                uid: c.uid,
                pid: c.pid,
            });
        }
        None => {
            crate::unix::close(fd);
            return Err(RelayError::NoCredentials);
        }
    }
    let raw = fd.into_raw_fd();
    // SAFETY: plain fcntl calls on our own socket: the replies are waited
    // for with poll, the sends are small.
    unsafe {
        let fl = real::fcntl()(raw, libc::F_GETFL, 0);
        real::fcntl()(
            raw,
            libc::F_SETFL,
            (fl & !libc::O_NONBLOCK) as libc::c_ulong,
        );
    }
    Ok(raw)
}

/// A connection to `port` of `dest` (the program's destination, another
/// host): a candidate if a relay runs here and the other host's relay says
/// a program under the library listens there. Otherwise no byte of the
/// library goes to the peer: a server without it would read the hello as
/// its own data. This host's relay is asked first (no probe leaves a host
/// without one), on the socket that then holds the reservation.
pub(crate) fn candidate(fd: c_int, dest: &libc::sockaddr_storage, port: u16) -> Option<Reserved> {
    let sock = match open() {
        Ok(s) => RelaySock(s),
        Err(why) => {
            log_line!(
                "fd {fd}: connection to port {port} stays on the kernel's TCP: the peer is on another host and {why}"
            );
            return None;
        }
    };
    match probe(dest, port) {
        // The relay is reserved before the connection, so that the hello
        // follows the connection's setup at once (a server that writes
        // first commits to the kernel's TCP when no hello is there yet).
        Ok(true) => match reserve(sock) {
            Ok(r) => Some(r),
            Err(why) => {
                log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
                None
            }
        },
        Ok(false) => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: no listener with the library there");
            None
        }
        Err(why) => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
            None
        }
    }
}

/// How long a connector waits for the other host's relay to answer its
/// probe. A host without a relay refuses the datagram (ICMP), which ends
/// the wait at once; this bounds the wait for a host that drops it.
const PROBE_WAIT_MS: c_int = 250;

/// Asks the relay of `dest`'s host (UDP, [`PROBE_PORT`]) whether a program
/// under the library listens on `port` there.
fn probe(dest: &libc::sockaddr_storage, port: u16) -> Result<bool, ProbeError> {
    let mut to = *dest;
    let (family, len) = match c_int::from(to.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &mut *std::ptr::from_mut(&mut to).cast::<libc::sockaddr_in>() };
            a.sin_port = PROBE_PORT.to_be();
            (4u8, std::mem::size_of::<libc::sockaddr_in>())
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &mut *std::ptr::from_mut(&mut to).cast::<libc::sockaddr_in6>() };
            a.sin6_port = PROBE_PORT.to_be();
            (6u8, std::mem::size_of::<libc::sockaddr_in6>())
        }
        _ => return Err(ProbeError::NotIp),
    };
    let mut nonce = [0u8; 8];
    // SAFETY: `nonce` is valid for writes of its length.
    if unsafe { libc::getrandom(nonce.as_mut_ptr().cast(), nonce.len(), 0) } != nonce.len() as isize
    {
        return Err(ProbeError::NoNonce);
    }
    let query = Probe {
        family,
        port,
        nonce,
    }
    .encode();
    // SAFETY: plain socket creation; `socket` is not interposed.
    let s = unsafe {
        libc::socket(
            c_int::from(to.ss_family),
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if s < 0 {
        return Err(ProbeError::Socket(std::io::Error::last_os_error()));
    }
    let result = (|| {
        // SAFETY: `to` is a valid socket address of `len` bytes; a UDP
        // connect only fixes the peer, so the host's ICMP refusal comes
        // back as ECONNREFUSED.
        if unsafe { real::connect()(s, std::ptr::from_ref(&to).cast(), len as libc::socklen_t) }
            != 0
        {
            return Err(ProbeError::Io(std::io::Error::last_os_error()));
        }
        // SAFETY: `query` is valid for reads of its length.
        let sent = unsafe { real::send()(s, query.as_ptr().cast(), query.len(), 0) };
        if sent != query.len() as isize {
            return Err(ProbeError::Io(std::io::Error::last_os_error()));
        }
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(PROBE_WAIT_MS as u64);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut p = libc::pollfd {
                fd: s,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { real::poll()(&mut p, 1, left.as_millis() as c_int) };
            if n == 0 {
                return Err(ProbeError::NoAnswer);
            }
            if n < 0 && errno() != libc::EINTR {
                return Err(ProbeError::Io(std::io::Error::last_os_error()));
            }
            let mut buf = [0u8; PROBE_BYTES + 1];
            // SAFETY: `buf` is valid for writes of its length.
            let got =
                unsafe { real::recv()(s, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if got < 0 {
                let e = errno();
                if e == libc::ECONNREFUSED {
                    return Err(ProbeError::NoRelay);
                }
                if e != libc::EAGAIN && e != libc::EINTR {
                    return Err(ProbeError::Io(std::io::Error::from_raw_os_error(e)));
                }
                continue;
            }
            // Anything but the answer to this probe is ignored.
            if let Ok(a) = ProbeAnswer::decode(&buf[..got as usize]) {
                if a.nonce == nonce && a.port == port {
                    return Ok(a.listening);
                }
            }
        }
    })();
    // SAFETY: the probe's own descriptor.
    unsafe { real::close()(s) };
    result
}

/// Sends `req` (with the region and the TCP socket, if given) to the
/// relay on `sock` and waits for its reply.
fn ask(sock: c_int, req: &RelayRequest, fds: Option<[c_int; 2]>) -> Result<RelayReply, RelayError> {
    let bytes = req.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let fds = fds.unwrap_or([-1, -1]);
    let with_fds = fds[0] >= 0;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(&fds) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if with_fds {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `msg` points at `control`, large enough for one header
        // with two descriptors (CMSG_SPACE above); the header and data
        // pointers come from the CMSG macros over that buffer.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(&fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                std::mem::size_of_val(&fds),
            );
        }
    }
    // SAFETY: a complete msghdr over live buffers (a plain libc call, not
    // interposed).
    let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if r != bytes.len() as isize {
        return Err(RelayError::Send(std::io::Error::last_os_error()));
    }
    let mut p = libc::pollfd {
        fd: sock,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { real::poll()(&mut p, 1, REPLY_WAIT_MS) };
    if n <= 0 {
        return Err(RelayError::Late);
    }
    let mut buf = [0u8; RELAY_REPLY_BYTES + 1];
    // SAFETY: `buf` is valid for writes of its length.
    let got = unsafe { real::recv()(sock, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if got <= 0 {
        return Err(RelayError::Closed);
    }
    RelayReply::decode(&buf[..got as usize]).map_err(RelayError::Reply)
}

/// The connector's side of a connection to another host, on a freshly
/// connected socket: the region made and the relay hello sent. The answer
/// is not waited for here (`setup::finish_offer` reads it on the
/// program's first call that needs it, then [`answered`] hands the
/// connection to the relay): two programs that connect to each other
/// before either accepts (Open MPI's ranks) would each wait in `connect`
/// for the other's answer. The program's writes fill the ring meanwhile.
/// Ok: the offered connection, or None when it stays on the kernel's TCP
/// before anything was sent. Err: the hello could not be sent whole, so
/// the byte stream is no longer the program's (see `setup::connected`).
pub(crate) fn connected(
    fd: c_int,
    port: u16,
    nonblocking: bool,
    reserved: Reserved,
) -> Result<Option<Arc<Conn>>, Errno> {
    let Reserved {
        key,
        ring,
        mut sock,
    } = reserved;
    let (ch, region) = match crate::region::make(ring) {
        Ok(made) => made,
        Err(why) => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
            return Ok(None);
        }
    };
    let offer = RelayOffer {
        key,
        ring_bytes: ring,
        sock: std::mem::replace(&mut sock.0, -1),
        region,
    };
    let c = Arc::new(Conn::new_offered(
        fd,
        ch,
        nonblocking,
        (port, OfferPath::Relay(offer)),
        -1,
    ));
    let hello = Hello::Relay {
        ring_bytes: ring,
        key,
    };
    c.send_hello(fd, port, &hello.encode())?;
    table::set(fd, Entry::Shm(c.clone()));
    Ok(Some(c))
}

/// The listener answered a relayed offer with its relay's `target`: this
/// host's relay is asked to connect there, with the connection's region
/// and socket. Ok: the relay socket, the connection's bell from now on.
/// Err: always broken, since the listener's side waits on its relay now
/// and the stream cannot be given back.
pub(crate) fn answered(fd: c_int, offer: &mut RelayOffer, target: &str) -> Result<c_int, NotMoved> {
    if reservation_ended(offer.sock) {
        // The relay waits a while only for a reserved connect: ask
        // afresh (a connect is a request of its own).
        let fresh = open().map_err(|why| NotMoved::Broken(why.to_string()))?;
        // SAFETY: the old reservation's socket, owned by the offer,
        // closed once (replaced below).
        unsafe { real::close()(offer.sock) };
        offer.sock = fresh;
    }
    let req = RelayRequest::Connect {
        ring_bytes: offer.ring_bytes,
        key: offer.key,
        target: target.to_owned(),
    };
    match ask(offer.sock, &req, Some([offer.region.0, fd])) {
        Ok(RelayReply::Ok(_)) => Ok(offer.take_sock()),
        Ok(RelayReply::Refused(why)) => Err(NotMoved::Broken(format!(
            "the relay refused to connect to {target}: {why}"
        ))),
        Err(why) => Err(NotMoved::Broken(why.to_string())),
    }
}

/// Whether the relay let a reservation go (it refused it or closed the
/// socket when its wait for the connect passed): anything readable on the
/// socket before the connect request says so.
fn reservation_ended(sock: c_int) -> bool {
    let mut p = libc::pollfd {
        fd: sock,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    unsafe { real::poll()(&mut p, 1, 0) != 0 }
}

/// The relay socket, closed on drop unless taken by the connection.
struct RelaySock(c_int);

impl Drop for RelaySock {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: our own relay socket, closed once.
            unsafe { real::close()(self.0) };
        }
    }
}

/// This host's relay, held for a connection about to be made (its key
/// and ring size drawn).
pub(crate) struct Reserved {
    key: [u8; RELAY_KEY_BYTES],
    ring: u32,
    sock: RelaySock,
}

/// Holds this host's relay, on `sock`, for a connection: refused at once
/// when the relay is busy, so the connection stays on the kernel's TCP
/// before the peer has seen anything.
fn reserve(sock: RelaySock) -> Result<Reserved, RelayError> {
    let key = crate::unix::random::<RELAY_KEY_BYTES>()
        .map_err(|e| RelayError::NoKey(std::io::Error::from_raw_os_error(e)))?;
    let ring = ring_bytes();
    match ask(
        sock.0,
        &RelayRequest::Reserve {
            ring_bytes: ring,
            key,
        },
        None,
    )? {
        RelayReply::Ok(_) => Ok(Reserved { key, ring, sock }),
        RelayReply::Refused(why) => Err(RelayError::Refused(why)),
    }
}

/// The listener's side of a relay hello: the region, the relay's listen,
/// its target. Ok: the channel, the relay socket and the target to answer.
pub(crate) fn take_hello(
    fd: c_int,
    hello: &Hello,
) -> Result<(crate::channel::Channel, c_int, String), (Refusal, String)> {
    let Hello::Relay { key, ring_bytes } = *hello else {
        return Err((Refusal::BadHello, "not a relay hello".into()));
    };
    let sock = open().map_err(|why| (Refusal::NoRelay, why.to_string()))?;
    let fail = |why: String| {
        // SAFETY: our own relay socket, closed once.
        unsafe { real::close()(sock) };
        (Refusal::NoRelay, why)
    };
    let (ch, region) = crate::region::make(ring_bytes).map_err(|e| fail(e.to_string()))?;
    let req = RelayRequest::Listen { ring_bytes, key };
    match ask(sock, &req, Some([region.0, fd])) {
        Ok(RelayReply::Ok(target)) if netgap_proto::preload::valid_target(&target) => {
            Ok((ch, sock, target))
        }
        Ok(RelayReply::Ok(target)) => Err(fail(format!(
            "the relay named an invalid target {target:?}"
        ))),
        Ok(RelayReply::Refused(why)) => Err(fail(format!("the relay refused: {why}"))),
        Err(why) => Err(fail(why.to_string())),
    }
}
