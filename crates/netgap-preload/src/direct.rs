//! Connections to other hosts on an AF_XDP socket of the program's own
//! (the library's `xdp` feature, asked for unless `NETGAP_PRELOAD_DIRECT=0`,
//! see `Settings::direct`): the host's relay makes the socket and
//! its UMEM on a queue of the connection's own and hands them over
//! (`netgap_proto::direct`, `netgap_transport::xdp::handover`); the
//! library runs netgap's reliable xdp transport on it
//! (`netgap_transport::xdp::direct::DirectConn`) from the program's own
//! calls, so a message wakes nobody but the two programs.
//!
//! - Both ends ask: the listener's side sends its relay an `Accept` (after
//!   the relayed listen, so the relayed path stays ready), the connector's
//!   a `Connect` to the target of the listener's answer. The relays agree
//!   on a queue; each end gets the grant and the port in one datagram, or
//!   a refusal. Both ends end up on the same path: the connector falls
//!   back to the relayed connect only after a refusal, which its relay
//!   gives before offering (for its caps or a want of queues it then
//!   offers no queue, on which the listener's relay refuses its `Accept`
//!   at once; otherwise that relay never sees an offer, and refuses the
//!   `Accept` when its wait passes) or after the other
//!   relay said no queue (refusing the listener's `Accept` too); the
//!   listener's side takes no path before its own grant or refusal, so it
//!   never guesses, and never waits for it longer than its program's call
//!   would wait for data: its connection stays pending meanwhile (a
//!   non-blocking read or write says `EAGAIN`, a blocking one waits up to
//!   its socket's timeout), the request's socket in its place in the
//!   program's poll, select and epoll, so the grant wakes them
//!   ([`try_granted`], `setup`'s `Pend::Granting`).
//! - The relay socket the grant came on stays open for the connection's
//!   life: the relay keeps the steering registration until it hangs up.
//! - A blocking call tries, and when it would block sleeps in poll on the
//!   connection's `wait_fd` for at most its `next_timer` (and the
//!   program's timeout), then tries again; a non-blocking one says
//!   `EAGAIN`. A peer given up (the engine's silence limit) is
//!   `ETIMEDOUT` once, then an end of stream to reads and `EPIPE` to
//!   writes, as the kernel says of a TCP peer that stopped answering.
//! - After `fork` only the process that opened the connection drives it
//!   (the engine's state is that process's): another process's calls
//!   fail with `EBADFD` and one log line, and its close sends nothing. An
//!   accepted connection is set up by the first process that reads it, so
//!   a server that accepts and lets a child serve works.
//! - Across `exec` the connection ends: its AF_XDP socket is
//!   close-on-exec and the engine's state stays in the old image; a
//!   marker file tells the new image's library to shut the inherited
//!   socket down (`inherit`).
//! - `select` on a direct connection is a poll of the same descriptors
//!   (`interpose::select_direct`), which asks the connection.
//! - The process's progress thread (`progress`) pumps every connection
//!   no program call pumped lately, so a program that computes or sleeps
//!   elsewhere still acknowledges its peer and sends lost frames again,
//!   and it finishes a close in the background: the program's `close`
//!   returns at once.
//! - A close ends the connection as the kernel's does: in order when
//!   nothing is left unread, with a reset (`ECONNRESET` at the peer) when
//!   bytes are unread (the transport's or the library's read-ahead), when
//!   bytes arrive after it, when the socket's `SO_LINGER` is 0, or when
//!   it cannot finish within its linger (the opening never answered: the
//!   program closed before both ends finished connecting). A reset from
//!   the peer is `ECONNRESET` once, then an end of stream to reads and
//!   `EPIPE` to writes.

use crate::errno::Errno;
use crate::log::log_line;
use crate::pid::pid;
use crate::progress::Link;
use crate::real;
use libc::{c_int, iovec};
use netgap_proto::direct::{
    DirectGrant, DirectRequest, DirectRole, DIRECT_GRANT_BYTES, DIRECT_GRANT_MAGIC,
};
use netgap_proto::preload::{RelayReply, RELAY_KEY_BYTES, RELAY_REPLY_BYTES};
use netgap_transport::xdp::direct::{DirectConn, DirectError, DirectSetup};
use netgap_transport::xdp::handover;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long the library waits for its relay's grant: the accepting
/// relay's wait for its link to come up (4 s), its wait for the other
/// half (3 s) and the moment after it that a late offer is still taken
/// (1 s), with room for the port's making.
const GRANT_WAIT: Duration = Duration::from_secs(9);
/// Bytes a read ahead takes at most (`MSG_PEEK`, `FIONREAD`, a read into
/// several buffers).
const AHEAD_BYTES: usize = 64 << 10;
/// The longest sleep between two pumps with no timer armed: the engine
/// arms one whenever it waits on the peer, so this only bounds a wait on
/// the program's own reader.
const IDLE_SLEEP: Duration = Duration::from_millis(200);

/// Why a connection did not get a direct path (it goes on the relay's).
#[derive(Debug, Error)]
pub(crate) enum SetupError {
    /// The request could not be sent.
    #[error("sending the direct request to the relay: {0}")]
    Send(std::io::Error),
    /// No reply within the wait.
    #[error("the relay did not grant or refuse within {GRANT_WAIT:?}")]
    Late,
    /// The relay closed its socket.
    #[error("the relay closed without replying")]
    Closed,
    /// A reply the library cannot read.
    #[error("the relay's reply: {0}")]
    Reply(netgap_proto::preload::HelloError),
    /// The relay said no, with its reason.
    #[error("{0}")]
    Refused(String),
    /// The relay replied to a connect with something else than a grant.
    #[error("the relay replied to a direct connect without a grant")]
    NotGrant,
    /// The grant's datagram could not be taken.
    #[error("taking the granted port: {0}")]
    Port(std::io::Error),
    /// The grant itself is not one.
    #[error("the relay's grant: {0}")]
    Grant(netgap_proto::preload::HelloError),
    /// The transport could not open the connection on the port.
    #[error("opening the direct connection: {0}")]
    Open(DirectError),
    /// The connection's wait descriptor (an epoll of its socket and its
    /// progress thread's eventfd) could not be made.
    #[error("making the direct connection's wait descriptor: {0}")]
    Wait(std::io::Error),
}

/// A relay socket with a direct request sent on it.
pub(crate) struct Asked {
    sock: OwnedFd,
    key: [u8; RELAY_KEY_BYTES],
    connector: bool,
    /// The connection's TCP socket (the program's descriptor).
    tcp: c_int,
    /// When the grant is given up on: [`GRANT_WAIT`] after the request.
    deadline: Instant,
}

impl Asked {
    /// The socket the relay's grant or refusal comes on: readable when
    /// it came (a waiter watches it).
    pub(crate) fn relay_fd(&self) -> c_int {
        self.sock.as_raw_fd()
    }

    /// When the grant is given up on.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// What the relay said so far to a direct request.
pub(crate) enum Heard {
    /// The grant came: the connection is open on its port.
    Granted(Direct),
    /// Nothing decisive yet: the request, to look at again.
    Waiting(Asked),
}

/// Sends the relay on `sock` (the library's socket to it, owned from now
/// on) the direct request for the connection `tcp` with `key`. Nothing is
/// waited for here: the listener's side answers the hello before its
/// relay replies, since its relay replies only once the link to the
/// connector's host is up, which the connector's request brings up when
/// there is none.
pub(crate) fn ask(
    sock: c_int,
    tcp: c_int,
    key: [u8; RELAY_KEY_BYTES],
    role: DirectRole,
) -> Result<Asked, SetupError> {
    // SAFETY: the caller hands its relay socket over; it is owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // The library's Unix sockets refuse descriptors (`unix::seqpacket`);
    // this one takes the port from the relay, which `relay::open` checked
    // is root's. Kernels without the switch take them anyway.
    let _ = crate::unix::pass_rights(sock.as_raw_fd(), true);
    let connector = matches!(role, DirectRole::Connect { .. });
    let req = DirectRequest { key, role }.encode();
    send_with_fd(sock.as_raw_fd(), &req, tcp).map_err(SetupError::Send)?;
    Ok(Asked {
        sock,
        key,
        connector,
        tcp,
        deadline: Instant::now() + GRANT_WAIT,
    })
}

/// Waits for the grant (or the refusal) of a request sent with [`ask`],
/// and opens the connection on the granted port.
pub(crate) fn granted(mut asked: Asked) -> Result<Direct, SetupError> {
    loop {
        if !readable(asked.sock.as_raw_fd(), asked.deadline) {
            return Err(SetupError::Late);
        }
        match try_granted(asked)? {
            Heard::Granted(d) => return Ok(d),
            Heard::Waiting(a) => asked = a,
        }
    }
}

/// Reads the relay's replies to `asked` that are in, without waiting,
/// and opens the connection on the granted port once the grant is in.
/// The accepting side's relay first replies with its end of the link,
/// which the relayed listen named already: it is passed over. Err: a
/// refusal, a reply the library cannot read, or the grant's wait over.
pub(crate) fn try_granted(asked: Asked) -> Result<Heard, SetupError> {
    let s = asked.sock.as_raw_fd();
    loop {
        if !readable(s, Instant::now()) {
            if Instant::now() >= asked.deadline {
                return Err(SetupError::Late);
            }
            return Ok(Heard::Waiting(asked));
        }
        if next_is_grant(s)? {
            return open_granted(asked).map(Heard::Granted);
        }
        match read_reply(s)? {
            RelayReply::Refused(why) => return Err(SetupError::Refused(why)),
            RelayReply::Ok(_) if !asked.connector => {}
            RelayReply::Ok(_) => return Err(SetupError::NotGrant),
        }
    }
}

/// Takes the grant and its port, next on `asked`'s socket, and opens the
/// connection on the port.
fn open_granted(asked: Asked) -> Result<Direct, SetupError> {
    let mut head = [0u8; DIRECT_GRANT_BYTES];
    let port = take_port(&asked, &mut head)?;
    let grant = DirectGrant::decode(&head).map_err(SetupError::Grant)?;
    let setup = DirectSetup {
        queue: u32::from(grant.queue),
        local_flow: grant.local_flow,
        peer_flow: grant.peer_flow,
        peer_mac: grant.peer_mac,
        key: asked.key,
        connector: asked.connector,
    };
    let conn = DirectConn::open(port, setup).map_err(SetupError::Open)?;
    let link = Arc::new(Link::new(conn, asked.sock).map_err(SetupError::Wait)?);
    crate::progress::watch(&link);
    let marker = exec_marker(asked.tcp);
    Ok(Direct {
        link,
        marker,
        queue: grant.queue,
        nonblocking: AtomicBool::new(false),
        opener: pid(),
        ahead: Mutex::new(Vec::new()),
        failed_told: AtomicBool::new(false),
        rd_shut: AtomicBool::new(false),
        foreign_told: AtomicBool::new(false),
        last_seen: AtomicU32::new(0),
        reset_on_close: AtomicBool::new(false),
        ended: AtomicBool::new(false),
    })
}

/// Takes the port handed with the grant on `asked`'s socket, the grant's
/// bytes into `head`. Its AF_XDP socket, which the connection keeps, is
/// the library's own: it moves above the program's numbers
/// ([`crate::unix::lift`]), close-on-exec as received, so a program that
/// sizes a table by the kernel's numbering does not see it. The UMEM's
/// memfd stays where it came: the connection closes it once mapped.
fn take_port(asked: &Asked, head: &mut [u8]) -> Result<handover::HandedPort, SetupError> {
    let mut port = handover::receive_after(asked.sock.as_fd(), head).map_err(SetupError::Port)?;
    port.socket = crate::unix::lift(port.socket);
    Ok(port)
}

/// The marker that tells an image after `exec` which inherited socket was
/// a direct connection (see `inherit`): a small file holding the socket's
/// inode. None if it cannot be made (the new image then sees only the
/// quiet socket).
fn exec_marker(tcp: c_int) -> Option<OwnedFd> {
    let ino = crate::conn::socket_ino(tcp);
    // SAFETY: a plain memfd_create with a valid name.
    let m = unsafe {
        libc::memfd_create(
            crate::inherit::DIRECT_MARKER_NAME.as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    if m < 0 {
        return None;
    }
    // SAFETY: a new descriptor nothing else owns.
    let m = crate::unix::lift(unsafe { OwnedFd::from_raw_fd(m) });
    let bytes = ino.to_le_bytes();
    // SAFETY: `bytes` is valid for reads of its length.
    let n = unsafe { libc::pwrite(m.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    (n == bytes.len() as isize).then_some(m)
}

/// Sends `bytes` on `sock` with the descriptor `fd` (`SCM_RIGHTS`).
fn send_with_fd(sock: c_int, bytes: &[u8], fd: c_int) -> std::io::Result<()> {
    let mut iov = iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<c_int>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: the control buffer is CMSG_SPACE bytes for one descriptor;
    // the header and data pointers come from the CMSG macros over it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<c_int>(), fd);
    }
    // SAFETY: a complete msghdr over live buffers (not interposed).
    let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if r != bytes.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `sock` has something to read before `deadline`.
fn readable(sock: c_int, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { real::poll()(&mut p, 1, ceil_ms(left)) };
        if n > 0 {
            return true;
        }
        if n == 0 || crate::errno::errno() != libc::EINTR {
            return false;
        }
    }
}

/// Whether the next datagram on `sock` is a grant (else a reply).
fn next_is_grant(sock: c_int) -> Result<bool, SetupError> {
    let mut magic = [0u8; 8];
    // SAFETY: `magic` is valid for writes of its length.
    let n = unsafe {
        real::recv()(
            sock,
            magic.as_mut_ptr().cast(),
            magic.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n <= 0 {
        return Err(SetupError::Closed);
    }
    Ok(magic == DIRECT_GRANT_MAGIC)
}

/// Reads one reply datagram.
fn read_reply(sock: c_int) -> Result<RelayReply, SetupError> {
    let mut buf = [0u8; RELAY_REPLY_BYTES + 1];
    // SAFETY: `buf` is valid for writes of its length.
    let got = unsafe { real::recv()(sock, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if got <= 0 {
        return Err(SetupError::Closed);
    }
    RelayReply::decode(&buf[..got as usize]).map_err(SetupError::Reply)
}

/// Milliseconds of `d` for poll, rounded up (a timer of a few microseconds
/// must not become a zero-timeout spin).
fn ceil_ms(d: Duration) -> c_int {
    let ms = d.as_nanos().div_ceil(1_000_000);
    c_int::try_from(ms).unwrap_or(c_int::MAX)
}

/// A connection on its own AF_XDP socket.
pub(crate) struct Direct {
    /// The engine, its relay socket and its wait descriptor, which the
    /// progress thread drives too and keeps through a close's linger.
    link: Arc<Link>,
    /// The connection's marker for an image after `exec`, close-on-exec
    /// as its descriptors are ([`Direct::sync_cloexec`]).
    marker: Option<OwnedFd>,
    queue: u16,
    /// The program asked for non-blocking I/O on the descriptor.
    nonblocking: AtomicBool,
    /// The process that opened the connection: the only one that drives
    /// it.
    opener: u32,
    /// Bytes read from the connection before the program asked for them
    /// (a peek, FIONREAD, a read into several buffers): read first.
    ahead: Mutex<Vec<u8>>,
    /// The peer was given up and a call said `ETIMEDOUT` already.
    failed_told: AtomicBool,
    /// The program shut down its receiving side.
    rd_shut: AtomicBool,
    /// Another process's use was logged already.
    foreign_told: AtomicBool,
    /// The poll events an epoll wait last saw (an edge-triggered
    /// registration is reported when an event is new).
    last_seen: AtomicU32,
    /// The close resets the connection ([`Direct::reset_on_close`]).
    reset_on_close: AtomicBool,
    /// The connection's close was handed to the progress thread
    /// ([`Direct::end`]): once only.
    ended: AtomicBool,
}

impl Direct {
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    /// The queue the connection's socket is bound to.
    pub(crate) fn queue(&self) -> u16 {
        self.queue
    }

    /// Whether this process drives the connection (see the module's
    /// notes on fork); says why not once.
    fn mine(&self, fd: c_int) -> Result<(), Errno> {
        if pid() == self.opener {
            return Ok(());
        }
        if !self.foreign_told.swap(true, Ordering::Relaxed) {
            log_line!(
                "fd {fd}: direct connection on queue {} is driven by pid {}, which opened it: this process's calls on it fail (EBADFD)",
                self.queue,
                self.opener
            );
        }
        Err(libc::EBADFD)
    }

    /// The errno of a failed call.
    fn errno_of(&self, e: &DirectError, reading: bool) -> Result<usize, Errno> {
        match e {
            DirectError::WouldBlock => Err(libc::EAGAIN),
            DirectError::Closed => Err(libc::EPIPE),
            DirectError::Timeout { .. } | DirectError::Reset => {
                if !self.failed_told.swap(true, Ordering::Relaxed) {
                    Err(if matches!(e, DirectError::Reset) {
                        libc::ECONNRESET
                    } else {
                        libc::ETIMEDOUT
                    })
                } else if reading {
                    Ok(0)
                } else {
                    Err(libc::EPIPE)
                }
            }
            _ => Err(libc::ECONNRESET),
        }
    }

    /// Sleeps until the connection may be `reading`-ready (or writable),
    /// its next timer is due, or `deadline` passed (`EAGAIN`); the
    /// deadline is read only when there is a sleep to bound. No spin
    /// first, unlike a shm connection's read: a look at a direct
    /// connection is a pump, system calls on its socket, and a 1-byte
    /// ping-pong across two testbed hosts took 92 µs a round trip with a
    /// 30 µs spin against 28 µs sleeping at once.
    fn wait(&self, reading: bool, deadline: &mut Deadline) -> Result<(), Errno> {
        self.link.take_signal();
        let r = self.link.conn.readiness();
        let ready = if reading { r.readable } else { r.writable };
        if ready {
            return Ok(());
        }
        let now = Instant::now();
        let mut sleep = self
            .link
            .conn
            .next_timer()
            .unwrap_or(IDLE_SLEEP)
            .min(IDLE_SLEEP);
        if let Some(d) = deadline.at() {
            if now >= d {
                return Err(libc::EAGAIN);
            }
            sleep = sleep.min(d - now);
        }
        // The socket and the thread's eventfd themselves, not their epoll
        // (`wait_fd`): an arrival wakes this poll directly.
        let mut p = self.link.wait_fds().map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        self.link.waiting(true);
        // SAFETY: two valid pollfds.
        unsafe { real::poll()(p.as_mut_ptr(), 2, ceil_ms(sleep)) };
        self.link.waiting(false);
        Ok(())
    }

    /// Reads into `iov` as `recv(2)` with `flags` would (`MSG_PEEK`,
    /// `MSG_DONTWAIT`, `MSG_WAITALL`).
    ///
    /// # Safety
    ///
    /// `iov`'s buffers are valid for writes of their lengths.
    pub(crate) unsafe fn recv(
        &self,
        fd: c_int,
        iov: &[iovec],
        flags: c_int,
    ) -> Result<usize, Errno> {
        self.mine(fd)?;
        self.link.called();
        let want: usize = iov.iter().map(|v| v.iov_len).sum();
        if want == 0 || self.rd_shut.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let peek = flags & libc::MSG_PEEK != 0;
        let dontwait = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !dontwait;
        let mut deadline = Deadline::of(fd, libc::SO_RCVTIMEO);
        let mut got = 0usize;
        loop {
            let r = {
                let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
                if ahead.is_empty() && !(peek || iov.len() > 1) && got == 0 {
                    // The common case: straight into the program's buffer.
                    let v = iov[0];
                    // SAFETY: the program's buffer, valid for writes of its
                    // length (this function's contract).
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), v.iov_len)
                    };
                    self.link.conn.try_recv(buf)
                } else {
                    if ahead.len() < want {
                        let mut more = vec![0u8; (want - ahead.len()).min(AHEAD_BYTES)];
                        match self.link.conn.try_recv(&mut more) {
                            Ok(n) => ahead.extend_from_slice(&more[..n]),
                            Err(DirectError::WouldBlock) => {}
                            Err(e) if ahead.is_empty() => return self.errno_of(&e, true),
                            Err(_) => {}
                        }
                    }
                    if ahead.is_empty() {
                        Err(DirectError::WouldBlock)
                    } else {
                        // SAFETY: as above, for every buffer of `iov`
                        // past the `got` bytes already written.
                        let n = unsafe { scatter(&ahead, iov, got) };
                        if !peek {
                            ahead.drain(..n);
                        }
                        Ok(n)
                    }
                }
            };
            match r {
                Ok(0) => return Ok(got),
                Ok(n) => {
                    got += n;
                    if !waitall || got >= want {
                        if got < want && !peek {
                            self.drained(libc::EPOLLIN as u32);
                        }
                        return Ok(got);
                    }
                }
                Err(DirectError::WouldBlock) if dontwait || got > 0 && !waitall => {
                    self.drained(libc::EPOLLIN as u32);
                    return if got > 0 { Ok(got) } else { Err(libc::EAGAIN) };
                }
                Err(DirectError::WouldBlock) => {
                    if let Err(e) = self.wait(true, &mut deadline) {
                        return if got > 0 { Ok(got) } else { Err(e) };
                    }
                }
                Err(_) if got > 0 => return Ok(got),
                Err(e) => return self.errno_of(&e, true),
            }
        }
    }

    /// Sends from `iov` as `send(2)` would: a blocking send moves all of
    /// it, a non-blocking one what the window takes now.
    ///
    /// # Safety
    ///
    /// `iov`'s buffers are valid for reads of their lengths.
    pub(crate) unsafe fn send(
        &self,
        fd: c_int,
        iov: &[iovec],
        flags: c_int,
    ) -> Result<usize, Errno> {
        self.mine(fd)?;
        self.link.called();
        let dontwait = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let mut deadline = Deadline::of(fd, libc::SO_SNDTIMEO);
        let mut sent = 0usize;
        for v in iov {
            // SAFETY: the program's buffer, valid for reads of its length
            // (this function's contract).
            let buf = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
            let mut at = 0usize;
            while at < buf.len() {
                match self.link.conn.try_send(&buf[at..]) {
                    Ok(n) => {
                        at += n;
                        sent += n;
                    }
                    Err(DirectError::WouldBlock) if dontwait => {
                        self.drained(libc::EPOLLOUT as u32);
                        return if sent > 0 {
                            Ok(sent)
                        } else {
                            Err(libc::EAGAIN)
                        };
                    }
                    Err(DirectError::WouldBlock) => {
                        if let Err(e) = self.wait(false, &mut deadline) {
                            return if sent > 0 { Ok(sent) } else { Err(e) };
                        }
                    }
                    Err(_) if sent > 0 => return Ok(sent),
                    Err(e) => return self.errno_of(&e, false),
                }
            }
        }
        Ok(sent)
    }

    /// Sends `bytes` whole, waiting as long as it takes whatever the
    /// descriptor's mode (until `by`, if given: then the connection is
    /// reset and the bytes dropped, `ETIMEDOUT`): the bytes the program
    /// wrote before the connection went direct, which it counts as sent.
    pub(crate) fn send_first(&self, bytes: &[u8], by: Option<Instant>) -> Result<(), Errno> {
        self.link.called();
        let mut deadline = Deadline::until(by);
        let mut at = 0usize;
        while at < bytes.len() {
            match self.link.conn.try_send(&bytes[at..]) {
                Ok(n) => at += n,
                Err(DirectError::WouldBlock) => {
                    if self.wait(false, &mut deadline).is_err() {
                        self.link.conn.reset();
                        return Err(libc::ETIMEDOUT);
                    }
                }
                Err(e) => return self.errno_of(&e, false).map(|_| ()),
            }
        }
        Ok(())
    }

    /// Bytes a read would return now (`FIONREAD`).
    pub(crate) fn readable_bytes(&self, fd: c_int) -> Result<usize, Errno> {
        self.mine(fd)?;
        self.link.called();
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mut more = vec![0u8; AHEAD_BYTES];
            match self.link.conn.try_recv(&mut more) {
                Ok(0) | Err(_) => return Ok(ahead.len()),
                Ok(n) => ahead.extend_from_slice(&more[..n]),
            }
            if ahead.len() >= AHEAD_BYTES {
                return Ok(ahead.len());
            }
        }
    }

    /// The poll(2) events the connection has of `events`, after one pump.
    pub(crate) fn poll_events(&self, events: i16) -> i16 {
        if pid() != self.opener {
            return libc::POLLERR;
        }
        self.link.called();
        self.link.take_signal();
        let r = self.link.conn.readiness();
        let ahead = !self
            .ahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        let mut out = 0i16;
        if r.readable || ahead || self.rd_shut.load(Ordering::Relaxed) {
            out |= libc::POLLIN & events;
        }
        if r.writable {
            out |= libc::POLLOUT & events;
        }
        if r.read_closed && !ahead {
            out |= libc::POLLRDHUP & events;
        }
        if r.hang_up {
            out |= libc::POLLHUP;
        }
        if r.error {
            out |= libc::POLLERR;
        }
        out
    }

    /// Gives the marker the close-on-exec flag of the connection's
    /// descriptors `fds`: kept across exec while one of them is, so the
    /// image after it learns the connection is gone.
    pub(crate) fn sync_cloexec(&self, fds: &[c_int]) {
        let Some(m) = &self.marker else {
            return;
        };
        let kept = fds.iter().any(|&fd| {
            // SAFETY: a plain fcntl on the program's descriptor.
            let f = unsafe { real::fcntl()(fd, libc::F_GETFD, 0) };
            f >= 0 && f & libc::FD_CLOEXEC == 0
        });
        let flag = if kept { 0 } else { libc::FD_CLOEXEC };
        // SAFETY: a plain fcntl on the connection's own marker.
        unsafe { real::fcntl()(m.as_raw_fd(), libc::F_SETFD, flag as libc::c_ulong) };
    }

    /// Records `events` as what an epoll wait saw now; the events that
    /// were not there the last time (an edge).
    pub(crate) fn newly_ready(&self, events: u32) -> u32 {
        events & !self.last_seen.swap(events, Ordering::Relaxed)
    }

    /// A read or a write found the connection without `events` (it took
    /// every byte there was, or the window is full): the next wait that
    /// finds them reports them again, to an edge-triggered registration
    /// too. The kernel's edge is an arrival, not a change of readiness
    /// between two waits: a server that reads a request, answers, and is
    /// back in its wait only after the next request arrived must see that
    /// request, though its wait saw the connection readable both times
    /// (nginx, kept alive, slept on such a request until its client gave
    /// up).
    fn drained(&self, events: u32) {
        self.last_seen.fetch_and(!events, Ordering::Relaxed);
    }

    /// A registration was made or changed: its next wait reports every
    /// event that is there.
    pub(crate) fn forget_seen(&self) {
        self.last_seen.store(0, Ordering::Relaxed);
    }

    /// The descriptor a waiter sleeps on, readable when frames arrived or
    /// the progress thread moved the connection.
    pub(crate) fn wait_fd(&self) -> c_int {
        self.link.wait_fd()
    }

    /// How long a waiter may sleep before a pump must run.
    pub(crate) fn next_timer(&self) -> Duration {
        self.link
            .conn
            .next_timer()
            .unwrap_or(IDLE_SLEEP)
            .min(IDLE_SLEEP)
    }

    /// `shutdown(2)` of the program's descriptor.
    pub(crate) fn shut(&self, how: c_int) {
        if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
            self.rd_shut.store(true, Ordering::Relaxed);
        }
        if (how == libc::SHUT_WR || how == libc::SHUT_RDWR) && pid() == self.opener {
            let _ = self.link.conn.shutdown_write();
        }
    }

    /// The connection's pending error for `SO_ERROR` (0: none), taken.
    pub(crate) fn take_error(&self) -> c_int {
        self.link.called();
        match self.link.conn.pump() {
            Err(e) if !self.failed_told.swap(true, Ordering::Relaxed) => {
                if matches!(e, DirectError::Reset) {
                    libc::ECONNRESET
                } else {
                    libc::ETIMEDOUT
                }
            }
            _ => 0,
        }
    }

    /// The last descriptor `fd` of the connection in this process
    /// closes, by the program's `close` or at its exit: a socket whose
    /// `SO_LINGER` is 0 resets the connection whatever is left unread, as
    /// the kernel's does at a close and at an exit alike, and the close
    /// has its line in the log. The close itself goes with [`Direct::end`].
    pub(crate) fn closing(&self, fd: c_int) {
        if crate::conn::lingers_zero(fd) {
            self.reset_on_close.store(true, Ordering::Relaxed);
        }
        self.log_close(fd);
    }

    /// The log line of the last close. In a process that does not drive
    /// the connection the counts are not read: its engine's lock may have
    /// been held by the opener's progress thread at the fork.
    fn log_close(&self, fd: c_int) {
        if pid() != self.opener {
            log_line!(
                "fd {fd}: direct connection on queue {} closed in a process that does not drive it",
                self.queue
            );
            return;
        }
        let s = self.link.conn.stats();
        log_line!(
            "fd {fd}: direct connection on queue {} closed: {} bytes sent, {} received, {} frames sent, {} received, {} sent again ({} after a timeout), {} dropped by the kernel",
            self.queue,
            s.bytes_sent,
            s.bytes_received,
            s.frames_sent,
            s.frames_received,
            s.retransmissions,
            s.timeouts,
            s.kernel_drops
        );
    }
}

/// When a blocking call gives up: its descriptor's `SO_RCVTIMEO` or
/// `SO_SNDTIMEO` from its first sleep, or never. Read at that sleep, not
/// per call: `getsockopt` is a system call, and a call that finds its
/// bytes (a ping-pong's every read and write) never sleeps.
struct Deadline {
    fd: c_int,
    opt: c_int,
    /// `None` until read; then the deadline, or `Some(None)`: never.
    at: Option<Option<Instant>>,
}

impl Deadline {
    /// A call that waits until `by`, or as long as it takes (`None`).
    fn until(by: Option<Instant>) -> Deadline {
        Deadline {
            fd: -1,
            opt: 0,
            at: Some(by),
        }
    }

    /// The deadline of a call on `fd` bounded by its option `opt`.
    fn of(fd: c_int, opt: c_int) -> Deadline {
        Deadline { fd, opt, at: None }
    }

    /// The deadline, read now if not yet.
    fn at(&mut self) -> Option<Instant> {
        let (fd, opt) = (self.fd, self.opt);
        *self.at.get_or_insert_with(|| {
            crate::exchange::socket_timeout(fd, opt).map(|t| Instant::now() + t)
        })
    }
}

impl Direct {
    /// The connection's last descriptor in this process closed, or the
    /// process exits with it open: in the process that drives it, its
    /// close goes on in the progress thread, a reset if bytes the library
    /// read ahead were never read by the program (or it asked for one);
    /// in any other, nothing is sent. Once only, whoever still holds the
    /// connection afterwards.
    pub(crate) fn end(&self) {
        if pid() != self.opener || self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let unread = !self
            .ahead
            .lock()
            .map_or_else(|p| p.into_inner().is_empty(), |a| a.is_empty());
        let reset = unread || self.reset_on_close.load(Ordering::Relaxed);
        crate::progress::close(self.link.clone(), reset);
    }
}

impl Drop for Direct {
    /// The program's last descriptor of the connection closed (see
    /// [`Direct::end`]).
    fn drop(&mut self) {
        self.end();
    }
}

/// Copies the front of `from` into `iov`, past its first `skip` bytes;
/// the bytes copied.
///
/// # Safety
///
/// `iov`'s buffers are valid for writes of their lengths.
unsafe fn scatter(from: &[u8], iov: &[iovec], mut skip: usize) -> usize {
    let mut n = 0usize;
    for v in iov {
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let room = v.iov_len - skip;
        let k = room.min(from.len() - n);
        // SAFETY: `k` bytes fit in the buffer past `skip` (the caller's
        // contract) and are in `from` past `n`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                from.as_ptr().add(n),
                v.iov_base.cast::<u8>().add(skip),
                k,
            )
        };
        skip = 0;
        n += k;
        if n == from.len() {
            break;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_ahead_scatters_across_the_programs_buffers_past_what_was_written() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 4];
        let iov = [
            iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: a.len(),
            },
            iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            },
        ];
        // SAFETY: both buffers live and are as long as said.
        let n = unsafe { scatter(b"xyzuv", &iov, 1) };
        assert_eq!(n, 5);
        assert_eq!(&a, b"\0xy");
        assert_eq!(&b, b"zuv\0");
    }

    /// A request sent on one end of a socket pair (the other plays the
    /// relay), as the listener's side sends it.
    fn asked_of_a_fake_relay() -> (Asked, OwnedFd) {
        let mut sv = [0 as c_int; 2];
        // SAFETY: `sv` is valid for writes of two descriptors.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) };
        assert_eq!(r, 0);
        // SAFETY: a new descriptor nothing else owns.
        let relay = unsafe { OwnedFd::from_raw_fd(sv[1]) };
        let asked = ask(
            sv[0],
            relay.as_raw_fd(),
            [3; RELAY_KEY_BYTES],
            DirectRole::Accept,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (asked, relay)
    }

    fn reply(relay: &OwnedFd, r: &RelayReply) {
        let b = r.encode();
        // SAFETY: `b` is valid for reads of its length.
        let n = unsafe { libc::send(relay.as_raw_fd(), b.as_ptr().cast(), b.len(), 0) };
        assert_eq!(n, b.len() as isize);
    }

    #[test]
    fn a_look_at_a_grant_not_come_waits_for_nothing_and_a_refusal_after_the_link_reply_ends_it() {
        let (asked, relay) = asked_of_a_fake_relay();
        let t0 = Instant::now();
        let Ok(Heard::Waiting(asked)) = try_granted(asked) else {
            panic!("a request with no reply is still awaited");
        };
        assert!(t0.elapsed() < Duration::from_millis(100));
        // The listener's relay first names its end of the link: passed over.
        reply(
            &relay,
            &RelayReply::Ok("10.0.0.1/02:00:00:00:00:01/7".into()),
        );
        let Ok(Heard::Waiting(asked)) = try_granted(asked) else {
            panic!("the link's reply is no answer to the request");
        };
        reply(&relay, &RelayReply::Refused("no queue".into()));
        assert!(matches!(try_granted(asked), Err(SetupError::Refused(w)) if w == "no queue"));
    }

    #[test]
    fn a_handed_ports_socket_moves_above_the_programs_numbers_close_on_exec() {
        use netgap_transport::xdp::handover::{Geometry, HandedPort};
        let memfd = || {
            // SAFETY: a plain memfd_create with a valid name.
            let fd = unsafe { libc::memfd_create(c"netgap-test".as_ptr(), 0) };
            assert!(fd >= 0);
            // SAFETY: a new descriptor nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let (asked, relay) = asked_of_a_fake_relay();
        // Memfds stand in for the socket and the UMEM: the handover moves
        // any two descriptors.
        let port = HandedPort {
            socket: memfd(),
            umem: memfd(),
            geometry: Geometry {
                frames: 256,
                frame_bytes: 4096,
                ring_entries: 128,
                queue: 1,
                ifindex: 2,
            },
        };
        let grant = [7u8; DIRECT_GRANT_BYTES];
        handover::send_after(relay.as_fd(), &grant, port).unwrap();
        let mut head = [0u8; DIRECT_GRANT_BYTES];
        let port = take_port(&asked, &mut head).unwrap();
        assert_eq!(head, grant);
        let socket = port.socket.as_raw_fd();
        assert!(socket >= crate::unix::lift_floor(), "{socket}");
        // SAFETY: a plain fcntl on an open descriptor.
        let flags = unsafe { libc::fcntl(socket, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        // The program's next descriptor takes a low number, as the kernel
        // numbers them, below the connection's socket.
        drop(port.umem);
        let next = memfd();
        assert!(next.as_raw_fd() < socket, "{} {socket}", next.as_raw_fd());
    }

    #[test]
    fn a_grant_not_come_within_its_wait_is_late() {
        let (mut asked, _relay) = asked_of_a_fake_relay();
        asked.deadline = Instant::now();
        assert!(matches!(try_granted(asked), Err(SetupError::Late)));
    }

    #[test]
    fn a_timer_of_microseconds_sleeps_a_whole_millisecond_not_zero() {
        assert_eq!(ceil_ms(Duration::from_micros(3)), 1);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_millis(7)), 7);
    }
}
