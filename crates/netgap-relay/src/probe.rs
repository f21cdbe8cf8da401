//! The relay's answer to probes from other hosts: does a program under
//! the preload library listen on this TCP port here?
//!
//! A connector's library on another host asks before it sends its relay
//! hello on a new connection, since a server without the library would
//! read the hello as its own data (a request it cannot parse, or worse).
//! The answer comes from the listeners' beacons: a listener under the
//! library holds an abstract listening Unix socket
//! `netgap-preload.UID.FAMILY.PORT` for as long as it listens, which
//! `/proc/net/unix` shows (to root, for the network namespace). Anyone can
//! bind such a name, so a beacon counts only once the kernel says its
//! owner is the uid its name gives (`SO_PEERCRED` of a connection to it,
//! checked once per beacon socket): a name squatted for a port where a
//! server without the library listens never brings a hello to that server.
//!
//! Limits: a probe is one datagram of exactly [`PROBE_BYTES`] and so is
//! the answer (no amplification); `/proc/net/unix` is read at most every
//! 50 ms for a port the last read found, every 5 ms for one it did not (a
//! listener that began since must not be answered "no" for 50 ms: a
//! client started right after its server would keep the kernel's TCP),
//! and at most 4 MiB of it; at most 5000 answers a second, the rest
//! dropped.

use netgap_proto::preload::{Probe, ProbeAnswer, PROBE_BYTES, PROBE_PORT};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::net::UdpSocket;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why the relay does not answer probes.
#[derive(Debug, Error)]
pub(crate) enum ProbeError {
    /// The probe port is taken (or not allowed).
    #[error("cannot answer probes on UDP port {PROBE_PORT}: {0}")]
    Bind(std::io::Error),
    /// No thread for the answers.
    #[error("no thread to answer probes: {0}")]
    Thread(std::io::Error),
}

/// How old the listeners read from `/proc/net/unix` may be for a port
/// they hold.
const SCAN_EVERY: Duration = Duration::from_millis(50);
/// How old they may be for a port they do not hold: a "no" comes from a
/// read this recent.
const MISS_SCAN_EVERY: Duration = Duration::from_millis(5);
/// Most bytes of `/proc/net/unix` read (about 40 000 sockets).
const MAX_SCAN_BYTES: u64 = 4 << 20;
/// Most answers a second.
const MAX_ANSWERS_PER_S: u32 = 5000;

/// Starts answering probes on UDP port [`PROBE_PORT`] (IPv6 and IPv4),
/// in a thread of its own; `Err` is one line saying why not (connectors
/// on other hosts then keep the kernel's TCP, safely).
pub(crate) fn spawn() -> Result<(), ProbeError> {
    let sock = UdpSocket::bind(("::", PROBE_PORT))
        .or_else(|_| UdpSocket::bind(("0.0.0.0", PROBE_PORT)))
        .map_err(ProbeError::Bind)?;
    std::thread::Builder::new()
        .name("relay-probe".into())
        .spawn(move || serve(&sock))
        .map_err(ProbeError::Thread)?;
    Ok(())
}

fn serve(sock: &UdpSocket) {
    let mut listening: HashSet<(u8, u16)> = HashSet::new();
    let mut verified: HashMap<u64, bool> = HashMap::new();
    let mut scanned: Option<Instant> = None;
    let mut second = Instant::now();
    let mut answered = 0u32;
    let mut buf = [0u8; PROBE_BYTES + 1];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Ok(probe) = Probe::decode(&buf[..n]) else {
            continue;
        };
        if second.elapsed() >= Duration::from_secs(1) {
            second = Instant::now();
            answered = 0;
        }
        if answered >= MAX_ANSWERS_PER_S {
            continue;
        }
        answered += 1;
        let key = (probe.family, probe.port);
        if must_scan(scanned.map(|t| t.elapsed()), listening.contains(&key)) {
            listening = read_listeners(&mut verified);
            scanned = Some(Instant::now());
        }
        let answer = ProbeAnswer {
            port: probe.port,
            listening: listening.contains(&key),
            nonce: probe.nonce,
        };
        let _ = sock.send_to(&answer.encode(), from);
    }
}

/// Whether the listeners must be read again before an answer: never read
/// (`age` None), or read longer ago than a "yes" ([`SCAN_EVERY`]) or a
/// "no" ([`MISS_SCAN_EVERY`]) may be, as the last read says (`found`).
fn must_scan(age: Option<Duration>, found: bool) -> bool {
    age.is_none_or(|a| a >= if found { SCAN_EVERY } else { MISS_SCAN_EVERY })
}

/// The (family, port) pairs with a listener's beacon in this network
/// namespace whose owner the kernel confirmed; empty if `/proc/net/unix`
/// cannot be read. `verified` remembers each beacon socket's verdict by
/// inode, so a beacon is connected to once, not at every scan.
fn read_listeners(verified: &mut HashMap<u64, bool>) -> HashSet<(u8, u16)> {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/proc/net/unix") {
        let _ = f.take(MAX_SCAN_BYTES).read_to_string(&mut text);
    }
    let found = beacons(&text);
    verified.retain(|ino, _| found.iter().any(|b| b.inode == *ino));
    found
        .into_iter()
        .filter(|b| *verified.entry(b.inode).or_insert_with(|| owned_as_named(b)))
        .map(|b| (b.family, b.port))
        .collect()
}

/// A beacon in `/proc/net/unix`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Beacon {
    name: String,
    uid: u32,
    family: u8,
    port: u16,
    inode: u64,
}

/// The listening beacons in `/proc/net/unix`'s text: a line's fields are
/// the slot, reference count, protocol, flags (a listening socket has
/// `__SO_ACCEPTCON`, 0x10000), type, state, inode and path (`@` first for
/// an abstract name).
fn beacons(text: &str) -> HashSet<Beacon> {
    const ACCEPTCON: u32 = 0x10000;
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (flags, inode, path) = (f.get(3)?, f.get(6)?, f.get(7)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            if flags & ACCEPTCON == 0 {
                return None;
            }
            let name = path.strip_prefix('@')?;
            let rest = name.strip_prefix("netgap-preload.")?;
            let mut parts = rest.split('.');
            let (Some(uid), Some(family), Some(port), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            let uid: u32 = uid.parse().ok()?;
            let family: u8 = family.parse().ok().filter(|f| *f == 4 || *f == 6)?;
            let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
            Some(Beacon {
                name: name.to_string(),
                uid,
                family,
                port,
                inode: inode.parse().ok()?,
            })
        })
        .collect()
}

/// Whether the kernel says the beacon's owner (the process that made it
/// listen) is the uid its name gives. The connection waits in the
/// beacon's backlog until its listener next accepts, which drains it.
fn owned_as_named(b: &Beacon) -> bool {
    use nix::sys::socket::{
        connect, getsockopt, socket, sockopt::PeerCredentials, AddressFamily, SockFlag, SockType,
        UnixAddr,
    };
    use std::os::fd::AsRawFd;
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    ) else {
        return false;
    };
    let Ok(addr) = UnixAddr::new_abstract(b.name.as_bytes()) else {
        return false;
    };
    connect(fd.as_raw_fd(), &addr).is_ok()
        && getsockopt(&fd, PeerCredentials).is_ok_and(|c| c.uid() == b.uid)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_no_comes_from_a_recent_read_and_a_yes_may_be_older() {
        assert!(must_scan(None, false));
        assert!(must_scan(None, true));
        let recent = Duration::from_millis(2);
        let older = Duration::from_millis(20);
        assert!(!must_scan(Some(recent), false));
        assert!(must_scan(Some(older), false));
        assert!(!must_scan(Some(older), true));
        assert!(must_scan(Some(SCAN_EVERY), true));
    }

    #[test]
    fn the_listening_beacons_are_read_from_proc_net_unix_and_nothing_else() {
        let text = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0005 01 27446 @netgap-preload.0.4.8080
0000000000000000: 00000002 00000000 00010000 0005 01 27447 @netgap-preload.33.6.443
0000000000000000: 00000003 00000000 00000000 0005 03 27453 @netgap-preload.0.4.8080
0000000000000000: 00000002 00000000 00010000 0005 01 27448 @netgap-preload.33.5.1
0000000000000000: 00000002 00000000 00010000 0005 01 27449 @netgap-preload.x.4.2
0000000000000000: 00000002 00000000 00010000 0005 01 27450 @netgap-relay
0000000000000000: 00000002 00000000 00010000 0005 01 27451 /run/netgap-preload.0.4.9
0000000000000000: 00000002 00000000 00010000 0005 01 27454 @netgap-preload.m.1f
0000000000000000: 00000002 00000000 00000000 0002 01 27452
";
        let b: HashSet<(u8, u16, u64)> = beacons(text)
            .into_iter()
            .map(|b| (b.family, b.port, b.inode))
            .collect();
        assert_eq!(b, HashSet::from([(4, 8080, 27446), (6, 443, 27447)]));
        assert!(beacons("").is_empty());
    }

    #[test]
    fn a_beacon_counts_only_when_its_owner_is_the_uid_it_names() {
        use nix::sys::socket::{bind, listen, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        use std::os::fd::AsRawFd;
        let me = nix::unistd::geteuid().as_raw();
        let pid = std::process::id();
        let mk = |uid: u32| {
            let name = format!("netgap-preload.{uid}.4.{}", 40000 + pid % 20000);
            let fd = socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            bind(
                fd.as_raw_fd(),
                &UnixAddr::new_abstract(name.as_bytes()).unwrap(),
            )
            .unwrap();
            listen(&fd, nix::sys::socket::Backlog::new(4).unwrap()).unwrap();
            (fd, name)
        };
        let (_ours, name) = mk(me);
        let b = Beacon {
            name,
            uid: me,
            family: 4,
            port: 1,
            inode: 1,
        };
        assert!(owned_as_named(&b));
        // A socket of this user's named for another user is a squatter's.
        let (_other, name) = mk(me.wrapping_add(1));
        let squat = Beacon {
            name,
            uid: me.wrapping_add(1),
            ..b
        };
        assert!(!owned_as_named(&squat));
    }
}
