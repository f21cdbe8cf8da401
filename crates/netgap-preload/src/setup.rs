//! Moving a connection from the kernel's TCP onto a shared-memory channel.
//!
//! - A listener with the library announces itself with a beacon: an
//!   abstract Unix socket bound to `netgap-preload.UID.FAMILY.PORT`
//!   (FAMILY 4 or 6: an IPv4 and an IPv6 listener may have the same port
//!   number; a dual-stack IPv6 listener announces both), which lives
//!   exactly as long as some process holds it (a killed program leaves
//!   nothing behind) and is private to the network namespace, like the
//!   port.
//! - A connector with the library, connecting to a local address, looks for
//!   the beacon; with none, the connection stays on the kernel's TCP and
//!   the peer never sees a byte of the library. With one, after the TCP
//!   connection is up it makes the region (a memfd, sealed against
//!   shrinking), sends the hello naming it and waits for the answer.
//! - The listener's side of an accepted connection is pending until the
//!   program first reads or writes: the first bytes are peeked; a hello
//!   moves it to the channel (the region opened through
//!   `/proc/PID/fd/FD`, checked, mapped, then the descriptor closed, so
//!   the memory disappears with the last mapping), anything else leaves it
//!   on the kernel's TCP.

use crate::channel::{region_bytes, Channel, Role};
use crate::conn::{errno, Conn, Errno};
use crate::log::log_line;
use crate::real;
use crate::table::{self, Entry};
use libc::c_int;
use netgap_proto::preload::{
    answer_bytes, could_be_answer, could_be_hello, hello_bytes, Answer, Hello, Refusal,
    ANSWER_BYTES, HELLO_BYTES,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of each ring unless `NETGAP_PRELOAD_RING_BYTES` says otherwise.
const DEFAULT_RING_BYTES: u32 = 1 << 18;
/// How long a connector waits for the listener's answer: the listener
/// answers when its program first reads the connection, which a busy
/// server may take a while to do.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How long a listener whose program writes before reading waits for a
/// hello: a connector with the library sends it at once after connecting.
const HELLO_WAIT: Duration = Duration::from_millis(200);

/// A listener's presence beacons (their descriptors, -1 for a name
/// another listener of the port holds; closed with the listener).
pub(crate) struct Beacon {
    fds: Vec<c_int>,
}

impl Drop for Beacon {
    fn drop(&mut self) {
        for &fd in self.fds.iter().filter(|&&fd| fd >= 0) {
            // SAFETY: the beacon's own descriptor, closed once.
            unsafe { real::close()(fd) };
        }
    }
}

/// The abstract socket address of the beacon for `port` of IP version
/// `family` (4 or 6).
fn beacon_addr(family: u8, port: u16) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = format!("netgap-preload.{uid}.{family}.{port}");
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays NUL: the abstract namespace.
    for (d, s) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// Binds a datagram socket to the beacon name of `port`: Ok(fd) if it was
/// free, Err(errno) otherwise (EADDRINUSE: a beacon exists).
fn bind_beacon(family: u8, port: u16) -> Result<c_int, Errno> {
    // SAFETY: plain socket creation; `socket` is not interposed.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    let (a, len) = beacon_addr(family, port);
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    let r = unsafe { libc::bind(fd, std::ptr::from_ref(&a).cast(), len) };
    if r != 0 {
        let e = errno();
        // SAFETY: our own descriptor.
        unsafe { real::close()(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// The listener `fd` just started listening: make its beacon (or share the
/// one another listener of the port made).
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
    let mut beacon = Beacon { fds: Vec::new() };
    for &f in families {
        match bind_beacon(f, port) {
            Ok(b) => beacon.fds.push(b),
            Err(libc::EADDRINUSE) => beacon.fds.push(-1),
            Err(e) => {
                log_line!(
                    "fd {fd}: listener on port {port} stays on the kernel's TCP: no beacon ({})",
                    std::io::Error::from_raw_os_error(e)
                );
                return;
            }
        }
    }
    table::set(
        fd,
        Entry::Listener {
            _beacon: Arc::new(beacon),
        },
    );
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

/// Whether a listener with the library announces `port` of IP version
/// `family`.
fn beacon_present(family: u8, port: u16) -> bool {
    match bind_beacon(family, port) {
        Ok(fd) => {
            // SAFETY: our own probe descriptor.
            unsafe { real::close()(fd) };
            false
        }
        Err(e) => e == libc::EADDRINUSE,
    }
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

fn ip_of(a: &libc::sockaddr_storage) -> Option<std::net::IpAddr> {
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

fn is_stream(fd: c_int) -> bool {
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

/// The rule for taking a connection over: both ends on this host (the
/// peer's address is loopback or the connection's own local address).
fn both_local(fd: c_int) -> bool {
    let (Some((l, _)), Some((p, _))) = (
        sockname(fd, libc::getsockname),
        sockname(fd, libc::getpeername),
    ) else {
        return false;
    };
    match (ip_of(&l), ip_of(&p)) {
        (Some(l), Some(p)) => p.is_loopback() || l == p,
        _ => false,
    }
}

/// Whether `addr` (given to `connect`) may lead to a listener with the
/// library: a TCP destination on this host whose port has a beacon.
/// Returns the port if so.
pub(crate) fn candidate(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Option<u16> {
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
        return crate::relay::candidate(fd, &a, port);
    }
    if !beacon_present(if ip.is_ipv4() { 4 } else { 6 }, port) {
        log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: no listener with the library there");
        return None;
    }
    Some(port)
}

/// Whether `ip` is one of this host's addresses: a UDP socket can bind to
/// it.
fn is_local_ip(ip: std::net::IpAddr) -> bool {
    let (family, storage, len) = match ip {
        std::net::IpAddr::V4(v4) => {
            // SAFETY: all-zero bytes are a valid sockaddr_storage.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in.
            let a = unsafe { &mut *std::ptr::from_mut(&mut s).cast::<libc::sockaddr_in>() };
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from(v4).to_be();
            (libc::AF_INET, s, std::mem::size_of::<libc::sockaddr_in>())
        }
        std::net::IpAddr::V6(v6) => {
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

/// Sends all of `buf` on a connected socket (blocking the caller).
pub(crate) fn send_all(fd: c_int, buf: &[u8]) -> Result<(), Errno> {
    let mut off = 0;
    let deadline = Instant::now() + ANSWER_WAIT;
    while off < buf.len() {
        // SAFETY: `buf[off..]` is valid for reads.
        let r = unsafe {
            real::send()(
                fd,
                buf[off..].as_ptr().cast(),
                buf.len() - off,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            off += r as usize;
            continue;
        }
        let e = errno();
        if e == libc::EAGAIN || e == libc::EINTR {
            if Instant::now() > deadline || !wait_for(fd, libc::POLLOUT, deadline) {
                return Err(libc::ETIMEDOUT);
            }
            continue;
        }
        return Err(e);
    }
    Ok(())
}

/// Waits until `fd` shows `events` or `deadline` passes; false on timeout.
pub(crate) fn wait_for(fd: c_int, events: i16, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        let ms = c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: one valid pollfd.
        let r = unsafe { real::poll()(&mut p, 1, ms) };
        if r > 0 {
            return true;
        }
        if r < 0 && errno() != libc::EINTR {
            return false;
        }
    }
}

/// Peeks at up to `buf.len()` bytes without waiting; Ok(0) at end of file.
pub(crate) fn peek(fd: c_int, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of its length.
    let r = unsafe {
        real::recv()(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Consumes `n` bytes already known to be in the socket.
pub(crate) fn consume(fd: c_int, n: usize) {
    let mut buf = [0u8; ANSWER_BYTES];
    let n = n.min(buf.len());
    // SAFETY: `buf` is valid for writes of `n` bytes; the bytes were peeked,
    // so the read does not block.
    unsafe { real::recv()(fd, buf.as_mut_ptr().cast(), n, libc::MSG_DONTWAIT) };
}

pub(crate) fn ring_bytes() -> u32 {
    crate::settings()
        .ring_bytes
        .filter(|v| {
            v.is_power_of_two()
                && (netgap_proto::preload::MIN_RING_BYTES..=netgap_proto::preload::MAX_RING_BYTES)
                    .contains(v)
        })
        .unwrap_or(DEFAULT_RING_BYTES)
}

/// The connector's side, on a freshly connected socket whose destination
/// has a beacon: the region and the hello. The answer is not waited for
/// here: the listener answers when its program first reads, and two
/// programs that connect to each other at once (Open MPI's ranks) would
/// each wait for the other's answer before either accepts. The connection
/// is offered (see [`finish_offer`]) until the program's first read or
/// poll finds the answer. Err: the hello could not be sent, so the byte
/// stream is no longer the program's: the connection is shut down and
/// `connect` fails with that errno rather than carry corrupt data.
///
/// A peer on another host goes to `relay::connected`, which does wait in
/// `connect` for the answer: the relays' xdp flow must be set up before
/// any byte moves, and a relayed connection has no offered state.
pub(crate) fn connected(fd: c_int, port: u16, nonblocking: bool) -> Result<(), Errno> {
    if !both_local(fd) {
        return crate::relay::connected(fd, port, nonblocking);
    }
    match offer(fd) {
        Ok((ch, mfd)) => {
            let c = Arc::new(Conn::new_offered(fd, ch, nonblocking, port, mfd));
            table::set_region(&c);
            table::set(fd, Entry::Shm(c));
            Ok(())
        }
        Err(Offer::Kept(why)) => {
            log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}");
            Ok(())
        }
        Err(Offer::Broken(why)) => {
            log_line!("fd {fd}: connection to port {port} fails (ECONNRESET): {why}");
            // SAFETY: a plain shutdown of the program's socket; `shutdown`
            // is not interposed.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            Err(libc::ECONNRESET)
        }
    }
}

/// Why a connection was not moved.
pub(crate) enum Offer {
    /// The stream is intact: it stays on the kernel's TCP.
    Kept(String),
    /// The hello went out unanswered: the stream cannot be used.
    Broken(String),
}

/// A region descriptor of this process, closed on drop: the mappings keep
/// the memory.
pub(crate) struct Region(pub(crate) c_int);

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the memfd made by `make_region`, closed once: the peer
        // has its own descriptor or mapping by now, and the mappings keep
        // the memory.
        unsafe { real::close()(self.0) };
    }
}

impl Region {
    /// The descriptor, no longer closed on drop (the caller owns it).
    pub(crate) fn into_raw(self) -> c_int {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }
}

/// Makes a region of `ring`-byte rings (a memfd sealed against shrinking
/// and growing) and maps it as its maker.
pub(crate) fn make_region(ring: u32) -> Result<(Channel, Region), String> {
    let total = region_bytes(ring as usize);
    let name = c"netgap-preload";
    // SAFETY: a NUL-terminated name and plain flags.
    let mfd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if mfd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    let region = Region(mfd);
    // SAFETY: plain calls on our own memfd.
    let sized = unsafe {
        libc::ftruncate(mfd, total as libc::off_t) == 0
            && libc::fcntl(
                mfd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ) == 0
    };
    if !sized {
        return Err(format!(
            "sizing the region: {}",
            std::io::Error::last_os_error()
        ));
    }
    let ch = Channel::map(mfd, ring as usize, Role::Connector)
        .map_err(|e| format!("mapping the region: {e}"))?;
    Ok((ch, region))
}

/// Makes the region and sends the hello; returns the channel and the
/// region's memfd, which must stay open until the listener has answered
/// (and then stays with the connection: see `Conn::new`).
fn offer(fd: c_int) -> Result<(Channel, c_int), Offer> {
    let ring = ring_bytes();
    let (ch, region) = make_region(ring).map_err(Offer::Kept)?;
    let hello = Hello {
        // SAFETY: getpid cannot fail.
        pid: unsafe { libc::getpid() }.cast_unsigned(),
        fd: region.0.cast_unsigned(),
        ring_bytes: ring,
        relay_key: None,
    };
    send_all(fd, &hello.encode()).map_err(|e| {
        Offer::Broken(format!(
            "sending the hello: {}",
            std::io::Error::from_raw_os_error(e)
        ))
    })?;
    Ok((ch, region.into_raw()))
}

/// The listener's answer as far as it arrived.
enum Heard {
    /// Not all of it yet.
    NotYet,
    /// The listener mapped the region.
    Accepted,
    /// The stream is intact, the listener refused.
    Refused(String),
    /// The stream cannot be used.
    Broken(String),
}

/// Reads the answer if all of it is in, without waiting: Ok(None) not
/// yet, Ok(Some) the answer (consumed), Err the stream cannot be used.
fn hear_answer(fd: c_int) -> Result<Option<Answer>, String> {
    let mut buf = [0u8; ANSWER_BYTES];
    match peek(fd, &mut buf) {
        Ok(0) => Err("the listener closed the connection before answering".into()),
        Ok(n) if !could_be_answer(&buf[..n]) => Err(
            "the listener answered with its program's data (it gave up waiting for the hello)"
                .into(),
        ),
        Ok(n) if answer_bytes(&buf[..n]).is_some_and(|w| n >= w) => {
            // Only the answer's own bytes: after a refusal the listener's
            // program data may follow at once.
            let w = answer_bytes(&buf[..n]).unwrap_or(ANSWER_BYTES);
            let a = Answer::decode(&buf[..w]).map_err(|e| format!("the listener's answer: {e}"))?;
            consume(fd, w);
            Ok(Some(a))
        }
        Ok(_) | Err(libc::EAGAIN) | Err(libc::EINTR) => Ok(None),
        Err(e) => Err(format!(
            "reading the answer: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}

/// The answer to a shared-memory hello, as far as it arrived.
fn hear(fd: c_int) -> Heard {
    match hear_answer(fd) {
        Ok(None) => Heard::NotYet,
        Ok(Some(Answer::Accepted)) => Heard::Accepted,
        Ok(Some(Answer::Refused(r))) => Heard::Refused(format!("the listener refused: {r}")),
        Ok(Some(Answer::Relay(_))) => {
            Heard::Broken("the listener answered a shared-memory hello with a relay".into())
        }
        Err(why) => Heard::Broken(why),
    }
}

/// Waits for the listener's answer to a hello just sent (up to the
/// answer's time limit): the relay path's connect waits for it, since the
/// relays' flow must be set up before any data moves.
pub(crate) fn read_answer(fd: c_int) -> Result<Answer, Offer> {
    let deadline = Instant::now() + ANSWER_WAIT;
    loop {
        match hear_answer(fd) {
            Ok(Some(a)) => return Ok(a),
            Ok(None) => {
                if !wait_for(fd, libc::POLLIN, deadline) {
                    return Err(Offer::Broken("no answer from the listener".into()));
                }
                // Part of the answer may be in: give the rest a moment.
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(why) => return Err(Offer::Broken(why)),
        }
    }
}

/// Ends the offer of the connector's connection `c` on `fd` if the answer
/// is in (waiting for it up to the answer's time limit when `wait`):
/// accepted, the connection is on shm; refused, what the program wrote
/// meanwhile goes over the kernel socket and the connection stays there;
/// broken (no answer in time, or the listener's program data instead), the
/// connection is shut down, so the program sees its end rather than
/// corrupt bytes.
pub(crate) fn finish_offer(fd: c_int, c: &Arc<Conn>, wait: bool) -> Resolved {
    let mut offer = c.offer_lock();
    let Some(port) = *offer else {
        // Another thread ended it.
        return match table::get(fd) {
            Some(Entry::Shm(d)) if Arc::ptr_eq(c, &d) => Resolved::Shm(d),
            _ => Resolved::Kernel,
        };
    };
    let deadline = Instant::now() + ANSWER_WAIT;
    let heard = loop {
        match hear(fd) {
            Heard::NotYet if !wait => return Resolved::NotYet,
            Heard::NotYet => {
                if !wait_for(fd, libc::POLLIN, deadline) {
                    break Heard::Broken("no answer from the listener".into());
                }
                // Part of the answer may be in: give the rest a moment.
                std::thread::sleep(Duration::from_micros(50));
            }
            h => break h,
        }
    };
    match heard {
        Heard::Accepted => {
            c.offer_accepted(fd, &mut offer);
            log_line!("fd {fd}: connection to port {port} moved to shm");
            Resolved::Shm(c.clone())
        }
        Heard::Refused(why) => {
            let sent = c.offer_refused(fd, &mut offer);
            table::resolve_conn(c);
            match sent {
                Ok(()) => {
                    log_line!("fd {fd}: connection to port {port} stays on the kernel's TCP: {why}")
                }
                Err(e) => {
                    log_line!("fd {fd}: connection to port {port} fails: {why}, then {e}");
                    // SAFETY: a plain shutdown of the program's socket.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                }
            }
            Resolved::Kernel
        }
        Heard::Broken(why) => {
            *offer = None;
            table::resolve_conn(c);
            log_line!("fd {fd}: connection to port {port} fails (shut down): {why}");
            // SAFETY: a plain shutdown of the program's socket; `shutdown`
            // is not interposed.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            Resolved::Kernel
        }
        Heard::NotYet => Resolved::NotYet,
    }
}

/// An accepted connection not yet resolved.
pub(crate) struct Pending {
    nonblocking: std::sync::atomic::AtomicBool,
    /// Serialises resolution between threads.
    lock: std::sync::Mutex<()>,
}

impl Pending {
    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.nonblocking
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The listener `lfd` accepted `fd`: it becomes pending (resolved by its
/// first bytes).
pub(crate) fn accepted(lfd: c_int, fd: c_int, nonblocking: bool) {
    // A peer on another host may send a relay hello, which must be
    // answered (a refusal when no relay runs here), so every accepted
    // connection waits for its first bytes.
    let _ = lfd;
    table::set(
        fd,
        Entry::Pending(Arc::new(Pending {
            nonblocking: std::sync::atomic::AtomicBool::new(nonblocking),
            lock: std::sync::Mutex::new(()),
        })),
    );
}

/// What a pending connection turned out to be.
pub(crate) enum Resolved {
    /// Moved to the channel.
    Shm(Arc<Conn>),
    /// Left on the kernel's TCP.
    Kernel,
    /// Nothing arrived yet (a read on a non-blocking descriptor should say
    /// EAGAIN).
    NotYet,
}

/// Looks at a pending connection's first bytes. `writing`: the program
/// writes before it read anything, so a missing hello is waited for a
/// little (then the connection stays on the kernel's TCP). A blocking
/// reader waits for the first bytes.
pub(crate) fn resolve(fd: c_int, p: &Arc<Pending>, writing: bool) -> Resolved {
    let _g = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have resolved it meanwhile.
    match table::get(fd) {
        Some(Entry::Pending(q)) if Arc::ptr_eq(p, &q) => {}
        Some(Entry::Shm(c)) => return Resolved::Shm(c),
        _ => return Resolved::Kernel,
    }
    let blocking = !p.nonblocking.load(std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    let mut buf = [0u8; HELLO_BYTES];
    let r = loop {
        match peek(fd, &mut buf) {
            Ok(0) => break Err("the peer closed before sending anything".to_string()),
            Ok(n) if !could_be_hello(&buf[..n]) => {
                break Err("the peer sent no hello (no library there)".into())
            }
            Ok(n) if hello_bytes(&buf[..n]).is_some_and(|w| n >= w) => {
                break Ok(hello_bytes(&buf[..n]).unwrap_or(HELLO_BYTES))
            }
            Ok(_) => {
                // A part of a hello: the rest follows at once.
                if start.elapsed() > ANSWER_WAIT {
                    break Err("the peer sent only part of a hello".into());
                }
                wait_for(fd, libc::POLLIN, Instant::now() + Duration::from_millis(1));
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(libc::EAGAIN) | Err(libc::EINTR) => {
                if writing {
                    if start.elapsed() >= HELLO_WAIT {
                        break Err("the program wrote before the peer sent anything".into());
                    }
                    wait_for(fd, libc::POLLIN, start + HELLO_WAIT);
                } else if blocking {
                    wait_for(fd, libc::POLLIN, Instant::now() + Duration::from_secs(3600));
                } else {
                    return Resolved::NotYet;
                }
            }
            Err(e) => {
                break Err(format!(
                    "the socket failed: {}",
                    std::io::Error::from_raw_os_error(e)
                ))
            }
        }
    };
    let outcome = match r {
        Ok(w) => take_hello(fd, &buf[..w]),
        Err(why) => Err(why),
    };
    match outcome {
        Ok(Taken {
            ch,
            region_fd,
            bell,
        }) => {
            let nonblocking = !blocking;
            let c =
                Arc::new(Conn::new(fd, ch, Role::Listener, nonblocking, region_fd).with_bell(bell));
            if region_fd >= 0 {
                table::set_region(&c);
            }
            table::resolve(p, Some(Entry::Shm(c.clone())));
            if bell >= 0 {
                crate::interpose::bell_joins_epolls(fd);
            }
            let to = if bell >= 0 {
                "xdp via the relay"
            } else {
                "shm"
            };
            log_line!("fd {fd}: accepted connection moved to {to}");
            Resolved::Shm(c)
        }
        Err(why) => {
            table::resolve(p, None);
            log_line!("fd {fd}: accepted connection stays on the kernel's TCP: {why}");
            Resolved::Kernel
        }
    }
}

/// A hello taken: the channel, and either the region's file (kept by the
/// connection, see `Conn::new`) or the relay's socket (-1 for none).
struct Taken {
    ch: Channel,
    region_fd: c_int,
    bell: c_int,
}

/// Consumes and acts on a whole hello: opens, checks and maps the region
/// (or has the relay take the connection), then answers.
fn take_hello(fd: c_int, buf: &[u8]) -> Result<Taken, String> {
    consume(fd, buf.len());
    let answer = |a: Answer| {
        let _ = send_all(fd, &a.encode());
    };
    let hello = match Hello::decode(buf) {
        Ok(h) => h,
        Err(e) => {
            answer(Answer::Refused(Refusal::BadHello));
            return Err(format!("bad hello: {e}"));
        }
    };
    if hello.relay_key.is_some() {
        return match crate::relay::take_hello(fd, &hello) {
            Ok((ch, bell, target)) => {
                answer(Answer::Relay(target));
                Ok(Taken {
                    ch,
                    region_fd: -1,
                    bell,
                })
            }
            Err((r, why)) => {
                answer(Answer::Refused(r));
                Err(why)
            }
        };
    }
    match map_region(&hello) {
        Ok((ch, region_fd)) => {
            answer(Answer::Accepted);
            Ok(Taken {
                ch,
                region_fd,
                bell: -1,
            })
        }
        Err((r, why)) => {
            answer(Answer::Refused(r));
            Err(why)
        }
    }
}

/// Opens, checks and maps the region a hello names: the channel and the
/// region's descriptor.
fn map_region(h: &Hello) -> Result<(Channel, c_int), (Refusal, String)> {
    let path = format!("/proc/{}/fd/{}\0", h.pid, h.fd);
    // SAFETY: a NUL-terminated path; `open` is not interposed.
    let rfd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    if rfd < 0 {
        return Err((
            Refusal::Unreachable,
            format!(
                "opening the region {}: {}",
                path.trim_end_matches('\0'),
                std::io::Error::last_os_error()
            ),
        ));
    }
    struct Close(c_int);
    impl Drop for Close {
        fn drop(&mut self) {
            if self.0 >= 0 {
                // SAFETY: the region descriptor opened above, closed once
                // on a failure.
                unsafe { real::close()(self.0) };
            }
        }
    }
    let mut close = Close(rfd);
    // SAFETY: all-zero bytes are a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    let r = unsafe { libc::fstat(rfd, &mut st) };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    // The seals keep the peer from shrinking the file under the mapping
    // (which would turn an access into SIGBUS).
    // SAFETY: a plain fcntl on our descriptor.
    let seals = unsafe { libc::fcntl(rfd, libc::F_GET_SEALS) };
    let total = region_bytes(h.ring_bytes as usize);
    let ok = r == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_uid == me
        && st.st_size == total as libc::off_t
        && seals >= 0
        && seals & libc::F_SEAL_SHRINK != 0;
    if !ok {
        return Err((
            Refusal::BadRegion,
            "the region is not a sealed file of this user of the announced size".into(),
        ));
    }
    let ch = Channel::map(rfd, h.ring_bytes as usize, Role::Listener)
        .map_err(|e| (Refusal::BadRegion, format!("mapping the region: {e}")))?;
    // The connection keeps the file (see `Conn::new`).
    close.0 = -1;
    Ok((ch, rfd))
}
