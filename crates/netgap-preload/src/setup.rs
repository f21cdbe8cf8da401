//! Moving a connection from the kernel's TCP onto a shared-memory channel
//! (the exchange itself is `netgap_proto::preload`'s; this module is its
//! two ends on real sockets).
//!
//! - A listener announces itself with a beacon (`beacon`).
//! - A connector to a local address first checks the port's beacon: with
//!   none of its own user's, the connection stays on the kernel's TCP and
//!   the peer never sees a byte of the library. With one, it makes the
//!   region and binds the connection's mailbox, connects, and sends its
//!   hello; its program's writes fill the ring meanwhile.
//!   The connection is *offered* until the program's next read, write or
//!   wait finds the answer ([`finish_offer`]).
//! - The listener's side of an accepted connection is *pending* until its
//!   program first reads, writes or waits for it ([`resolve`]): the first
//!   bytes are peeked; a whole hello from a peer on this host moves it to
//!   the channel, once the kernel has said who the connector is and the
//!   region was taken from it and checked (`take_region`); anything else
//!   (a part of a hello too: a connector sends it whole) is the program's
//!   data on the kernel's TCP. Nothing here waits on a peer's bytes longer
//!   than the program's own call would have: a non-blocking socket with
//!   nothing in gets `EAGAIN`, a blocking one waits as a read would
//!   (bounded by its receive timeout), and a program that writes before a
//!   hello came commits its connection to the kernel's TCP at once (a hello
//!   that comes after is dropped unanswered; its connector then sees the
//!   program's data first and stays on TCP too).
//! - Across hosts (`-t xdp` only), a connector offers the relays the same
//!   way (`relay::connected`), and a peer's whole relay hello is taken the
//!   same way, by the host's relay.

use crate::beacon;
use crate::channel::Role;
use crate::conn::{Conn, OfferPath};
use crate::diag::Ends;
use crate::errno::Errno;
use crate::exchange::{
    consume, hear_answer, peek, ring_bytes, send_all, wait_for, Heard, NotMoved, ANSWER_WAIT,
};
use crate::log::log_line;
#[cfg(feature = "xdp")]
use crate::pending::Granting;
use crate::pending::{Pend, Pending};
use crate::real;
use crate::region;
use crate::table::{self, Entry};
use crate::unix;
use libc::c_int;
use netgap_proto::preload::{
    could_be_hello, hello_bytes, mailbox_name, Answer, Hello, HELLO_BYTES,
};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

mod closing;
#[cfg(feature = "xdp")]
mod grant;
use closing::watch_answer;
pub(crate) use closing::{close_offered, shut_offered};

/// How long a listener whose program writes first waits for the hello of
/// a connector the kernel says is there (its mailbox is bound): the
/// connector sends it right after binding.
const HELLO_WAIT: Duration = Duration::from_millis(20);
/// Connections a mailbox holds: the listener's look, and room for a few
/// others (anyone can connect to an abstract name; nothing of theirs is
/// read).
const MAILBOX_BACKLOG: c_int = 8;

/// The listener `fd` just started listening: it announces itself (or
/// shares the beacon another listener of the port made).
pub(crate) fn listening(fd: c_int) {
    let Some((family, port)) = local_port(fd) else {
        return;
    };
    if family != libc::AF_INET && family != libc::AF_INET6 || !is_stream(fd) {
        return;
    }
    let families: &[u8] = if family == libc::AF_INET {
        &[4]
    } else if v6_only(fd) {
        &[6]
    } else {
        &[6, 4]
    };
    if let Some(beacon) = beacon::listening(fd, port, families) {
        table::set(
            fd,
            Entry::Listener {
                beacon: Arc::new(beacon),
            },
        );
    }
}

/// Whether an IPv6 socket takes IPv6 connections only.
fn v6_only(fd: c_int) -> bool {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `v` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    r == 0 && v != 0
}

/// The family and port `fd` is bound to.
fn local_port(fd: c_int) -> Option<(c_int, u16)> {
    let (a, _) = sockname(fd, libc::getsockname)?;
    Some((c_int::from(a.ss_family), port_of(&a)?))
}

type NameFn = unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> c_int;

fn sockname(fd: c_int, f: NameFn) -> Option<(libc::sockaddr_storage, libc::socklen_t)> {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut a: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `a` is valid for writes of `len` bytes.
    let r = unsafe { f(fd, std::ptr::from_mut(&mut a).cast(), &mut len) };
    (r == 0).then_some((a, len))
}

fn port_of(a: &libc::sockaddr_storage) -> Option<u16> {
    match c_int::from(a.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let s = unsafe { &*std::ptr::from_ref(a).cast::<libc::sockaddr_in>() };
            Some(u16::from_be(s.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s = unsafe { &*std::ptr::from_ref(a).cast::<libc::sockaddr_in6>() };
            Some(u16::from_be(s.sin6_port))
        }
        _ => None,
    }
}

fn ip_of(a: &libc::sockaddr_storage) -> Option<IpAddr> {
    match c_int::from(a.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let s = unsafe { &*std::ptr::from_ref(a).cast::<libc::sockaddr_in>() };
            Some(std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)).into())
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s = unsafe { &*std::ptr::from_ref(a).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(ip.to_ipv4_mapped().map_or(ip.into(), Into::into))
        }
        _ => None,
    }
}

pub(crate) fn is_stream(fd: c_int) -> bool {
    let mut t: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `t` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            std::ptr::from_mut(&mut t).cast(),
            &mut len,
        )
    };
    r == 0 && t == libc::SOCK_STREAM
}

fn ends(fd: c_int) -> Option<Ends> {
    let (l, _) = sockname(fd, libc::getsockname)?;
    let (p, _) = sockname(fd, libc::getpeername)?;
    Some(((ip_of(&l)?, port_of(&l)?), (ip_of(&p)?, port_of(&p)?)))
}

/// Whether a connection with these ends has both on this host (the peer's
/// address is loopback or the connection's own local address).
fn both_local(e: &Ends) -> bool {
    e.1 .0.is_loopback() || e.0 .0 == e.1 .0
}

/// Whether `addr` (given to `connect`) may lead to a listener with the
/// library: a TCP destination on this host whose port has a beacon of
/// this user that the kernel vouches for, or (`-t xdp`) one on another
/// host (`relay::candidate`). Returns the port if so.
pub(crate) fn candidate(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Option<Candidate> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: `addr` is non-null and at least a sockaddr_in long (the
    // program's argument to connect); only its family is read here.
    let family = c_int::from(unsafe { (*addr).sa_family });
    if family != libc::AF_INET && family != libc::AF_INET6 || !is_stream(fd) {
        return None;
    }
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut a: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `addr` is valid for reads of `len` bytes, `a` for writes of
    // `n ≤ len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            std::ptr::from_mut(&mut a).cast::<u8>(),
            n,
        )
    };
    let port = port_of(&a)?;
    let ip = ip_of(&a)?;
    if !(ip.is_loopback() || is_local_ip(ip)) {
        return crate::relay::candidate(fd, &a, port).map(|r| Candidate {
            port,
            local: None,
            relay: Some(r),
        });
    }
    match beacon::find(if ip.is_ipv4() { 4 } else { 6 }, port) {
        // The region and the mailbox are made before the connection: the
        // listener finds the mailbox as soon as it accepts, and the hello
        // follows the connection's setup at once.
        beacon::Found::Ours => match prepare(fd) {
            Ok(local) => Some(Candidate {
                port,
                local: Some(local),
                relay: None,
            }),
            Err(why) => {
                log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
                None
            }
        },
        beacon::Found::None => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: no listener with the library there");
            None
        }
        beacon::Found::Refused(why) => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
            None
        }
    }
}

/// A connection that may move: its destination port, and for a peer on
/// this host what was made for it.
pub(crate) struct Candidate {
    pub(crate) port: u16,
    local: Option<Local>,
    relay: Option<crate::relay::Reserved>,
}

/// What a connector to a peer on this host makes before it connects: the
/// region and the connection's mailbox (closed on drop, as when the
/// connection fails).
struct Local {
    ch: crate::channel::Channel,
    region: region::Region,
    mailbox: Mailbox,
}

/// A mailbox socket of the library's, closed on drop.
struct Mailbox(Option<OwnedFd>);

impl Drop for Mailbox {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            unix::close(m);
        }
    }
}

/// Why a connector to a peer on this host could not make what its
/// connection needs before it connects.
#[derive(Debug, Error)]
enum PrepareError {
    /// No region.
    #[error(transparent)]
    Region(#[from] region::RegionError),
    /// The socket has no inode.
    #[error("the socket has no inode to name its mailbox by")]
    NoInode,
    /// No socket for the mailbox.
    #[error("no mailbox socket: {0}")]
    NoMailbox(std::io::Error),
    /// The mailbox's name could not be bound.
    #[error("the connection's mailbox @{name}: {why}")]
    Mailbox {
        /// The mailbox's abstract name.
        name: String,
        /// The bind's or listen's error.
        why: std::io::Error,
    },
}

/// Makes the region and binds the mailbox of the connection `fd` is about
/// to make.
fn prepare(fd: c_int) -> Result<Local, PrepareError> {
    let (ch, region) = region::make(ring_bytes())?;
    let ino = crate::conn::socket_ino(fd);
    if ino == 0 {
        return Err(PrepareError::NoInode);
    }
    let m = unix::seqpacket()
        .map_err(|err| PrepareError::NoMailbox(std::io::Error::from_raw_os_error(err)))?;
    let name = mailbox_name(ino);
    if let Err(err) = unix::listen_at(m.as_raw_fd(), &name, MAILBOX_BACKLOG) {
        unix::close(m);
        return Err(PrepareError::Mailbox {
            name,
            why: std::io::Error::from_raw_os_error(err),
        });
    }
    Ok(Local {
        ch,
        region,
        mailbox: Mailbox(Some(m)),
    })
}

/// Whether `ip` is one of this host's addresses: a UDP socket can bind to
/// it.
fn is_local_ip(ip: IpAddr) -> bool {
    let (family, storage, len) = match ip {
        IpAddr::V4(v4) => {
            // SAFETY: all-zero bytes are a valid sockaddr_storage.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in.
            let a = unsafe { &mut *std::ptr::from_mut(&mut s).cast::<libc::sockaddr_in>() };
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from(v4).to_be();
            (libc::AF_INET, s, std::mem::size_of::<libc::sockaddr_in>())
        }
        IpAddr::V6(v6) => {
            // SAFETY: all-zero bytes are a valid sockaddr_storage.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: as above, for a sockaddr_in6.
            let a = unsafe { &mut *std::ptr::from_mut(&mut s).cast::<libc::sockaddr_in6>() };
            a.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            a.sin6_addr.s6_addr = v6.octets();
            (libc::AF_INET6, s, std::mem::size_of::<libc::sockaddr_in6>())
        }
    };
    // SAFETY: plain socket calls on a descriptor of our own, closed after.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let r = libc::bind(
            fd,
            std::ptr::from_ref(&storage).cast(),
            len as libc::socklen_t,
        );
        real::close()(fd);
        r == 0
    }
}

/// When a blocking read of `fd` gives up: its receive timeout
/// (`SO_RCVTIMEO`) from now, or far in the future without one.
fn read_deadline(fd: c_int) -> Instant {
    let far = Duration::from_secs(365 * 24 * 3600);
    Instant::now() + crate::exchange::socket_timeout(fd, libc::SO_RCVTIMEO).unwrap_or(far)
}

/// The connector's side, on a freshly connected socket whose destination
/// has a beacon of this user: the region, the mailbox, the hello. The
/// answer is not waited for here: the listener answers when its program
/// first reads, and two programs that connect to each other at once (Open
/// MPI's ranks) would each wait for the other's answer before either
/// accepts. Err: the hello could not be sent whole, so the byte stream is
/// no longer the program's: the connection is shut down and `connect`
/// fails with that errno rather than carry corrupt data.
///
/// A peer on another host goes to `relay::connected`, which offers the
/// relays the same way: its answer is read by [`finish_offer`] too.
pub(crate) fn connected(fd: c_int, cand: Candidate, nonblocking: bool) -> Result<(), Errno> {
    let port = cand.port;
    let Some(e) = ends(fd) else {
        return Ok(());
    };
    if !both_local(&e) {
        if let Some(r) = cand.relay {
            if let Some(c) = crate::relay::connected(fd, port, nonblocking, r)? {
                watch_relay_answer(fd, c);
            }
        }
        return Ok(());
    }
    let Some(Local {
        ch,
        region,
        mut mailbox,
    }) = cand.local
    else {
        return Ok(());
    };
    let ring = ch.capacity();
    let region_fd = region.into_raw();
    // The connection records its socket's inode in the region's header,
    // which the listener checks against the kernel's word before taking it.
    let c = Arc::new(Conn::new_offered(
        fd,
        ch,
        nonblocking,
        (
            port,
            OfferPath::Shm {
                mailbox: mailbox.0.take(),
            },
        ),
        region_fd,
    ));
    let hello = Hello::Shm {
        ring_bytes: ring,
        region_fd: region_fd.cast_unsigned(),
    };
    c.send_hello(fd, port, &hello.encode())?;
    table::set(fd, Entry::Shm(c.clone()));
    table::set_region(&c);
    crate::inherit::sync_cloexec(&c);
    Ok(())
}

/// Watches a relayed offer's answer from a thread of the library's own,
/// so the relay takes the connection as soon as the listener answers,
/// whatever the program does meanwhile: a program that writes on its
/// connection and then waits on another (for a peer that waits for those
/// bytes) would otherwise never see its own connection move, where on the
/// kernel's TCP the bytes simply go. The thread ends with the offer, or
/// after the answer's time limit (the program's own calls then end it, as
/// they do without the thread, which is also what happens if no thread can
/// be started).
fn watch_relay_answer(fd: c_int, c: Arc<Conn>) {
    let watch = move || {
        watch_answer(&c, Instant::now() + ANSWER_WAIT);
    };
    let started = std::thread::Builder::new()
        .name("netgap-answer".into())
        .stack_size(WATCH_STACK_BYTES)
        .spawn(watch);
    if let Err(why) = started {
        log_line!("fd {fd}: no thread to watch the relayed connection's answer ({why}); the program's next call on it takes the answer");
    }
}

/// The stack of a thread that ends a relayed offer: it asks the relay,
/// writes a log line and closes, nothing deeper.
pub(crate) const WATCH_STACK_BYTES: usize = 256 << 10;

/// What a pending or offered connection turned out to be.
pub(crate) enum Resolved {
    /// Moved to the channel.
    Shm(Arc<Conn>),
    /// Moved to an AF_XDP socket of its own.
    #[cfg(feature = "xdp")]
    Direct(Arc<crate::direct::Direct>),
    /// Left on the kernel's TCP.
    Kernel,
    /// Not yet known (a read on a non-blocking descriptor says EAGAIN).
    NotYet,
}

/// Ends the offer of the connector's connection `c` on `fd` if the answer
/// is in (waiting for it up to the answer's time limit when `wait`):
/// accepted, the connection is on shm (or, relayed, this host's relay
/// takes it: `relay::answered`); refused, or the listener's program data
/// first, what the program wrote meanwhile goes over the kernel socket and
/// the connection stays there; broken (no answer in time, a bad one, the
/// relay failing once the listener's side waits on its own), the
/// connection is shut down, so the program sees its end rather than
/// corrupt bytes.
pub(crate) fn finish_offer(fd: c_int, c: &Arc<Conn>, wait: bool) -> Resolved {
    finish_offer_by(fd, c, wait.then(|| Instant::now() + ANSWER_WAIT))
}

/// As [`finish_offer`], waiting for the answer until `deadline` if given.
/// The answer is read on the offer's own descriptor ([`Offer::fd`]); `fd`
/// is the caller's, looked up once another thread ended the offer.
pub(super) fn finish_offer_by(fd: c_int, c: &Arc<Conn>, deadline: Option<Instant>) -> Resolved {
    let mut guard = c.offer_lock();
    let Some(offer) = guard.as_mut() else {
        // Another thread ended it.
        #[cfg(feature = "xdp")]
        if let Some(d) = c.went_direct() {
            return Resolved::Direct(d);
        }
        return match table::get(fd) {
            Some(Entry::Shm(d)) if Arc::ptr_eq(c, &d) => Resolved::Shm(d),
            #[cfg(feature = "xdp")]
            Some(Entry::Direct(d)) => Resolved::Direct(d),
            _ => Resolved::Kernel,
        };
    };
    let port = offer.port;
    let fd = offer.fd;
    let end = loop {
        match hear_answer(fd) {
            Heard::NotYet => {
                let Some(deadline) = deadline else {
                    return Resolved::NotYet;
                };
                if !wait_for(fd, libc::POLLIN, deadline) {
                    break Err(NotMoved::Broken("no answer from the listener".into()));
                }
                // Part of the answer may be in: give the rest a moment.
                std::thread::sleep(Duration::from_micros(50));
            }
            Heard::Answer(answer) => break take_answer(fd, &mut offer.path, answer),
            Heard::ProgramData => {
                break Err(NotMoved::Kept(
                    "the listener's program wrote before it saw the hello".into(),
                ))
            }
            Heard::Eof => {
                break Err(NotMoved::Kept(
                    "the listener closed before answering".into(),
                ))
            }
            Heard::Broken(why) => break Err(NotMoved::Broken(why)),
        }
    };
    // The relay took its socket if it took the connection: the rest of
    // the offer (the mailbox, the region's descriptor) closes here.
    let shut = guard.take().and_then(|o| o.shut);
    // The offer's lock is held until the connection is where the answer
    // took it: a thread that waited for the lock finds the offer gone and
    // must then find the connection there (gone direct, given back), not
    // on the ring it had, where a reader would sleep for good.
    let resolved = end_offer(fd, port, c, end);
    drop(guard);
    c.apply_deferred_shutdown(fd, shut);
    resolved
}

/// The offer of `c` on `fd` (to `port`) ended as `end` says: the
/// connection goes where the answer took it.
fn end_offer(fd: c_int, port: u16, c: &Arc<Conn>, end: Result<Taken, NotMoved>) -> Resolved {
    match end {
        #[cfg(feature = "xdp")]
        Ok(Taken::Direct(d)) => went_direct(fd, port, c, d),
        Ok(taken) => {
            let bell = match taken {
                Taken::Relay(bell) => bell,
                _ => -1,
            };
            let to = if bell >= 0 {
                c.set_bell(bell);
                "xdp via the relay"
            } else {
                "shm"
            };
            c.offer_accepted(fd);
            if bell >= 0 {
                crate::bell::bell_joins_epolls(fd);
            }
            log_line!("fd {fd}: connection to port {port} moved to {to}");
            Resolved::Shm(c.clone())
        }
        Err(NotMoved::Kept(why)) => {
            let sent = c.offer_refused(fd);
            table::resolve_conn(c);
            match sent {
                Ok(()) => {
                    log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}")
                }
                Err(e) => {
                    log_line!("fd {fd}: connection to port {port} fails: {why}, then {e}");
                    // SAFETY: a plain shutdown of the program's socket.
                    unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
                }
            }
            Resolved::Kernel
        }
        Err(NotMoved::Broken(why)) => {
            c.offer_dropped();
            table::resolve_conn(c);
            log_line!("fd {fd}: connection to port {port} fails (shut down): {why}");
            // SAFETY: a plain shutdown of the program's socket.
            unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
            Resolved::Kernel
        }
    }
}

/// Where an offered connection went once the listener accepted it.
enum Taken {
    /// The same-host channel.
    Shm,
    /// Through this host's relay, which took the connection (its socket,
    /// the connection's bell from now on).
    Relay(c_int),
    /// Onto an AF_XDP socket of its own.
    #[cfg(feature = "xdp")]
    Direct(crate::direct::Direct),
}

/// The listener's whole answer to the offer on `path`. A relayed answer
/// is first taken to this host's relay as a direct request (with the
/// `xdp` feature): the connection goes direct when the relays grant it,
/// else on the relay's path, whose listen waits at the listener's relay
/// meanwhile (see `direct`'s notes on how both ends agree).
fn take_answer(fd: c_int, path: &mut OfferPath, answer: Answer) -> Result<Taken, NotMoved> {
    match (path, answer) {
        (OfferPath::Shm { .. }, Answer::Accepted) => Ok(Taken::Shm),
        (OfferPath::Relay(offer), Answer::Relay(target)) => {
            #[cfg(feature = "xdp")]
            if crate::settings().direct {
                match connect_direct(fd, offer.key, &target) {
                    Ok(d) => return Ok(Taken::Direct(d)),
                    Err(why) => log_line!("fd {fd}: relay: {why}"),
                }
            }
            crate::relay::answered(fd, offer, &target).map(Taken::Relay)
        }
        (_, Answer::Refused(r)) => Err(NotMoved::Kept(format!("the listener refused: {r}"))),
        (OfferPath::Shm { .. }, Answer::Relay(_)) => Err(NotMoved::Broken(
            "the listener answered a shared-memory hello with a relay".into(),
        )),
        (OfferPath::Relay(_), Answer::Accepted) => Err(NotMoved::Broken(
            "the listener answered a relay hello as a shared-memory one".into(),
        )),
    }
}

/// Asks this host's relay for a direct connection to the relay at
/// `target` (the listener's answer), and opens it on the granted port.
#[cfg(feature = "xdp")]
fn connect_direct(
    fd: c_int,
    key: [u8; netgap_proto::preload::RELAY_KEY_BYTES],
    target: &str,
) -> Result<crate::direct::Direct, ConnectDirectError> {
    let sock = crate::relay::open()?;
    let role = netgap_proto::direct::DirectRole::Connect {
        target: target.to_owned(),
    };
    let asked = crate::direct::ask(sock, fd, key, role)?;
    Ok(crate::direct::granted(asked)?)
}

/// Why a connector's direct request did not give it a direct connection
/// (it goes on the relay's path, with this one line).
#[cfg(feature = "xdp")]
#[derive(Debug, Error)]
enum ConnectDirectError {
    /// No relay socket.
    #[error(transparent)]
    Relay(#[from] crate::relay::RelayError),
    /// The request, the grant or the port.
    #[error(transparent)]
    Setup(#[from] crate::direct::SetupError),
}

/// The connector's offer went direct: what its program wrote into the
/// ring meanwhile goes first on the direct connection, and every
/// descriptor of the connection is the direct one from now on.
#[cfg(feature = "xdp")]
fn went_direct(fd: c_int, port: u16, c: &Arc<Conn>, d: crate::direct::Direct) -> Resolved {
    let d = Arc::new(d);
    d.set_nonblocking(c.nonblocking());
    let sent = c.offer_went_direct(&d).map_err(|e| e.to_string());
    table::conn_went_direct(c, &d);
    d.sync_cloexec(&table::direct_descriptors(&d));
    crate::bell::bell_joins_epolls(fd);
    if let Err(why) = sent {
        log_line!("fd {fd}: connection to port {port} fails (shut down): the bytes written before it went direct: {why}");
        d.shut(libc::SHUT_RDWR);
        // SAFETY: a plain shutdown of the program's socket.
        unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
    } else {
        log_line!(
            "fd {fd}: connection to port {port} moved to direct on queue {}",
            d.queue()
        );
    }
    Resolved::Direct(d)
}

/// The listener accepted `fd` (with `accept4`'s `flags`): a connection
/// from a peer on this host, or (`-t xdp`) from another host, is pending
/// until its first bytes; any other stays the kernel's alone.
pub(crate) fn accepted(lfd: c_int, fd: c_int, flags: c_int) {
    if let Some(Entry::Listener { beacon }) = table::get(lfd) {
        beacon.drain();
    }
    let Some(e) = ends(fd) else {
        return;
    };
    let stage = if both_local(&e) {
        Pend::Local
    } else if crate::settings().stack == crate::Stack::Xdp {
        Pend::Remote
    } else {
        return;
    };
    table::set(
        fd,
        Entry::Pending(Arc::new(Pending {
            nonblocking: std::sync::atomic::AtomicBool::new(flags & libc::SOCK_NONBLOCK != 0),
            stage: Mutex::new(stage),
            ends: e,
            #[cfg(feature = "xdp")]
            granting: Mutex::new(None),
        })),
    );
}

/// Whether the connection with ends `e` (this end first) has a mailbox of
/// this process's user: its connector runs the library.
fn mailbox_is_ours(e: &Ends) -> bool {
    let Ok(sock) = crate::diag::tcp_socket(e.1, e.0) else {
        return false;
    };
    let Ok(m) = unix::seqpacket() else {
        return false;
    };
    let ours = unix::connect_to(m.as_raw_fd(), &mailbox_name(sock.inode)).is_ok()
        && unix::peer_cred(m.as_raw_fd()).is_some_and(|c| c.uid == unix::euid());
    unix::close(m);
    ours
}

/// What the first bytes on a pending connection are, as far as they
/// arrived.
enum First {
    /// A whole hello of this many bytes.
    Hello(usize),
    /// The program's data, or the end of the stream, or an error (what,
    /// for the log): the connection is the kernel's.
    NotHello(&'static str),
    /// Nothing yet.
    Nothing,
}

fn first_bytes(fd: c_int, buf: &mut [u8; HELLO_BYTES]) -> First {
    match peek(fd, buf) {
        Ok(0) => First::NotHello("the peer closed before sending anything"),
        Ok(n) if could_be_hello(&buf[..n]) => match hello_bytes(&buf[..n]) {
            Some(w) if n >= w => First::Hello(w),
            // A part of a hello: a connector sends it whole, at once, so
            // this is the program's data.
            _ => First::NotHello("the peer sent a part of a hello, read as its data"),
        },
        Ok(_) => First::NotHello("the peer sent no hello"),
        Err(libc::EAGAIN | libc::EINTR) => First::Nothing,
        Err(_) => First::NotHello("the socket failed"),
    }
}

/// Looks at a pending connection as the program reads it (`writing`:
/// writes it; `dontwait`: a read that must not wait whatever the
/// descriptor's mode), and resolves it if its first bytes allow.
pub(crate) fn resolve(fd: c_int, p: &Arc<Pending>, writing: bool, dontwait: bool) -> Resolved {
    let mut st = p.stage.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have resolved it meanwhile.
    match table::get(fd) {
        Some(Entry::Pending(q)) if Arc::ptr_eq(p, &q) => {}
        Some(Entry::Shm(c)) => return Resolved::Shm(c),
        #[cfg(feature = "xdp")]
        Some(Entry::Direct(d)) => return Resolved::Direct(d),
        _ => return Resolved::Kernel,
    }
    let waits = !writing && !dontwait && !p.nonblocking();
    let until = read_deadline(fd);
    let mut buf = [0u8; HELLO_BYTES];
    let mut waited = false;
    loop {
        #[cfg(feature = "xdp")]
        if *st == Pend::Granting {
            return grant::in_call(fd, p, st, !dontwait && !p.nonblocking(), until);
        }
        let first = first_bytes(fd, &mut buf);
        let done = match (*st, first) {
            (Pend::Watch { .. }, First::NotHello(_)) => Done::Kernel(None),
            (_, First::NotHello(why)) => Done::Kernel(Some(why)),
            (Pend::Watch { remote }, First::Hello(w)) => {
                let ours = match Hello::decode(&buf[..w]) {
                    Ok(Hello::Relay { .. }) => remote,
                    Ok(Hello::Shm { .. }) => !remote,
                    Err(_) => false,
                };
                if ours {
                    consume(fd, w);
                    Done::Kernel(Some(
                        "the program wrote before the peer's hello came (dropped)",
                    ))
                } else {
                    Done::Kernel(None)
                }
            }
            (Pend::Local, First::Hello(w)) => match Hello::decode(&buf[..w]) {
                Ok(Hello::Shm {
                    ring_bytes,
                    region_fd,
                }) => {
                    consume(fd, w);
                    take_region(fd, &p.ends, ring_bytes, region_fd)
                }
                _ => Done::Kernel(Some("the peer's first bytes are no hello")),
            },
            (Pend::Remote, First::Hello(w)) => match Hello::decode(&buf[..w]) {
                Ok(h @ Hello::Relay { .. }) => {
                    consume(fd, w);
                    take_relay_hello(fd, &h)
                }
                _ => Done::Kernel(Some("the peer's first bytes are no relay hello")),
            },
            // Looked at at the top of the loop, never here.
            #[cfg(feature = "xdp")]
            (Pend::Granting, First::Hello(_)) => continue,
            (Pend::Watch { .. }, First::Nothing) if writing => return Resolved::Kernel,
            (Pend::Local, First::Nothing) if writing && !waited && mailbox_is_ours(&p.ends) => {
                // The program writes before the hello came, but the
                // kernel says a connector of this user with the library is
                // there (its mailbox): its hello follows within
                // microseconds.
                waited = true;
                wait_for(fd, libc::POLLIN, Instant::now() + HELLO_WAIT);
                continue;
            }
            (Pend::Remote, First::Nothing) if writing && !waited && !p.nonblocking() => {
                // A program that writes first on a blocking socket (gmond)
                // under -t xdp: a connector on another host sends its relay
                // hello as soon as it is connected; it crosses the link in
                // well under this bound. The wait holds only this
                // connection's own blocking call.
                waited = true;
                wait_for(fd, libc::POLLIN, Instant::now() + HELLO_WAIT);
                continue;
            }
            (Pend::Local | Pend::Remote, First::Nothing) if writing => {
                // The program writes before the peer said anything: its
                // bytes go on the kernel's TCP now.
                log_line!("fd {fd}: accepted connection stays on the kernel's TCP: the program wrote before the peer sent anything");
                *st = Pend::Watch {
                    remote: *st == Pend::Remote,
                };
                return Resolved::Kernel;
            }
            (_, First::Nothing) => {
                if waits && wait_for(fd, libc::POLLIN, until) {
                    continue;
                }
                return Resolved::NotYet;
            }
        };
        #[cfg(feature = "xdp")]
        let done = match done {
            Done::Granting(g) => {
                grant::keep(fd, p, &mut st, g);
                continue;
            }
            done => done,
        };
        drop(st);
        return finish_pending(fd, p, done);
    }
}

/// How a pending connection ended.
pub(super) enum Done {
    /// On shm (or through the relay).
    Shm(Arc<Conn>),
    /// On an AF_XDP socket of its own.
    #[cfg(feature = "xdp")]
    Direct(Arc<crate::direct::Direct>),
    /// Not yet: the hello answered, the direct request's grant awaited.
    #[cfg(feature = "xdp")]
    Granting(Granting),
    /// The kernel's, and why (for the log; None: said already).
    Kernel(Option<&'static str>),
}

/// Takes the region a local connector's hello announced, from the process
/// the kernel says is the connector, checks and maps it, and answers.
fn take_region(fd: c_int, e: &Ends, ring: u32, region_fd: u32) -> Done {
    match region::take_from_peer(e, ring, region_fd) {
        Ok((ch, region)) => {
            if let Err(err) = send_all(fd, &Answer::Accepted.encode()) {
                log_line!(
                    "fd {fd}: accepted connection fails (shut down): answering: {}",
                    std::io::Error::from_raw_os_error(err)
                );
                // SAFETY: a plain shutdown of the program's socket.
                unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
                return Done::Kernel(None);
            }
            Done::Shm(Arc::new(Conn::new(
                fd,
                ch,
                Role::Listener,
                false,
                region.into_raw(),
            )))
        }
        Err((r, why)) => {
            log_line!("fd {fd}: accepted connection stays on the kernel's TCP: {why}");
            let _ = send_all(fd, &Answer::Refused(r).encode());
            Done::Kernel(None)
        }
    }
}

/// A peer on another host's relay hello: the host's relay takes the
/// connection, or it stays on the kernel's TCP.
fn take_relay_hello(fd: c_int, hello: &Hello) -> Done {
    match crate::relay::take_hello(fd, hello) {
        Ok((ch, bell, target)) => {
            #[cfg(feature = "xdp")]
            let direct = accept_direct(fd, hello);
            if send_all(fd, &Answer::Relay(target).encode()).is_err() {
                // SAFETY: a plain shutdown of the program's socket.
                unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
                // SAFETY: the relay socket of ours, closed once.
                unsafe { real::close()(bell) };
                return Done::Kernel(None);
            }
            // The connector asks for the direct connection once it has
            // the answer; the grant (or the refusal) comes to both ends,
            // and is awaited as the program's calls and waits allow
            // (`Pend::Granting`), never longer.
            #[cfg(feature = "xdp")]
            if let Some(asked) = direct {
                // SAFETY: the relayed listen's socket to the relay, ours,
                // owned from here.
                let bell = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(bell) };
                crate::pid::pid();
                let forks = crate::pid::forks();
                return Done::Granting(Granting {
                    asked,
                    ch,
                    bell,
                    forks,
                });
            }
            Done::Shm(Arc::new(
                Conn::new(fd, ch, Role::Listener, false, -1).with_bell(bell),
            ))
        }
        Err((r, why)) => {
            log_line!("fd {fd}: accepted connection stays on the kernel's TCP: {why}");
            let _ = send_all(fd, &Answer::Refused(r).encode());
            Done::Kernel(None)
        }
    }
}

/// The listener's side asks its relay for a direct connection with the
/// hello's key (after the relayed listen, which stays ready for the
/// connector's fallback); None when direct connections are off
/// (`NETGAP_PRELOAD_DIRECT`), or (with one log line) when the request
/// cannot be sent. Its replies are read once the hello is answered.
#[cfg(feature = "xdp")]
fn accept_direct(fd: c_int, hello: &Hello) -> Option<crate::direct::Asked> {
    let Hello::Relay { key, .. } = *hello else {
        return None;
    };
    if !crate::settings().direct {
        return None;
    }
    let asked = crate::relay::open()
        .map_err(|e| e.to_string())
        .and_then(|sock| {
            crate::direct::ask(sock, fd, key, netgap_proto::direct::DirectRole::Accept)
                .map_err(|e| e.to_string())
        });
    match asked {
        Ok(asked) => Some(asked),
        Err(why) => {
            log_line!("fd {fd}: relay: {why}");
            None
        }
    }
}

/// Applies a pending connection's end to the table.
pub(super) fn finish_pending(fd: c_int, p: &Arc<Pending>, done: Done) -> Resolved {
    match done {
        #[cfg(feature = "xdp")]
        Done::Granting(g) => {
            grant::keep(
                fd,
                p,
                &mut p.stage.lock().unwrap_or_else(|e| e.into_inner()),
                g,
            );
            Resolved::NotYet
        }
        #[cfg(feature = "xdp")]
        Done::Direct(d) => {
            d.set_nonblocking(p.nonblocking());
            table::resolve(p, Some(Entry::Direct(d.clone())));
            d.sync_cloexec(&table::direct_descriptors(&d));
            crate::bell::bell_joins_epolls(fd);
            log_line!(
                "fd {fd}: accepted connection moved to direct on queue {}",
                d.queue()
            );
            Resolved::Direct(d)
        }
        Done::Shm(c) => {
            c.set_nonblocking(p.nonblocking());
            table::resolve(p, Some(Entry::Shm(c.clone())));
            if c.region_fd() >= 0 {
                table::set_region(&c);
                crate::inherit::sync_cloexec(&c);
            }
            let to = if c.bell() >= 0 {
                crate::bell::bell_joins_epolls(fd);
                "xdp via the relay"
            } else {
                "shm"
            };
            log_line!("fd {fd}: accepted connection moved to {to}");
            Resolved::Shm(c)
        }
        Done::Kernel(why) => {
            if let Some(why) = why {
                log_line!("fd {fd}: accepted connection stays on the kernel's TCP: {why}");
            }
            table::resolve(p, None);
            Resolved::Kernel
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::RelayOffer;
    use netgap_proto::preload::Refusal;

    fn relayed() -> OfferPath {
        OfferPath::Relay(RelayOffer {
            key: [7; netgap_proto::preload::RELAY_KEY_BYTES],
            ring_bytes: 1 << 16,
            sock: -1,
            region: region::Region(-1),
        })
    }

    fn kept(r: Result<Taken, NotMoved>) -> bool {
        matches!(r, Err(NotMoved::Kept(_)))
    }

    fn broken(r: Result<Taken, NotMoved>) -> bool {
        matches!(r, Err(NotMoved::Broken(_)))
    }

    #[test]
    fn an_answer_for_the_other_data_path_breaks_the_offer_and_a_refusal_keeps_the_stream() {
        let shm = || OfferPath::Shm { mailbox: None };
        assert!(matches!(
            take_answer(-1, &mut shm(), Answer::Accepted),
            Ok(Taken::Shm)
        ));
        assert!(broken(take_answer(
            -1,
            &mut shm(),
            Answer::Relay("10.0.0.1/02:00:00:00:00:01/7".into())
        )));
        assert!(broken(take_answer(-1, &mut relayed(), Answer::Accepted)));
        for mut path in [shm(), relayed()] {
            assert!(kept(take_answer(
                -1,
                &mut path,
                Answer::Refused(Refusal::NoRelay)
            )));
        }
    }
}
