//! A listener's beacon: the sign that a program under the library listens
//! on a TCP port of this network namespace, for one user.
//!
//! The beacon is an abstract `SOCK_SEQPACKET` socket named
//! `netgap-preload.UID.FAMILY.PORT` (FAMILY 4 or 6: an IPv4 and an IPv6
//! listener may have the same port number; a dual-stack IPv6 listener
//! announces both), listening, taking no descriptors. It lives exactly as
//! long as some process holds it (a killed program leaves nothing behind)
//! and is private to the network namespace, like the port. Anyone can bind
//! any abstract name, so a connector believes a beacon only once the
//! kernel vouched for its owner: it connects to it and reads
//! `SO_PEERCRED`, the credentials of the process that made it listen,
//! which must be the connector's own user. A name held by another user is
//! a squatter: the connection stays on the kernel's TCP and not a byte of
//! the library goes to the port.
//!
//! Those probes wait in the beacon's backlog until a process of the
//! listener accepts them; it does so each time its program accepts a
//! connection ([`drain`]), and closes them unread.

use crate::log::log_line;
use crate::unix;
use libc::c_int;
use netgap_proto::preload::beacon_name;
use std::os::fd::{AsRawFd, OwnedFd};

/// Probes a beacon's backlog holds: connectors probe once per connection
/// and the listener drains them at each accept, so this only needs to
/// cover the connections a busy listener has not accepted yet.
const BACKLOG: c_int = 1024;
/// Most probes drained per accept (the rest wait for the next).
const DRAIN_PER_ACCEPT: usize = 64;

/// A listener's beacons (one per IP version it takes), closed with the
/// listener. `None` for a name another listener of the port holds.
pub(crate) struct Beacon {
    fds: Vec<Option<OwnedFd>>,
}

impl Drop for Beacon {
    fn drop(&mut self) {
        for fd in self.fds.drain(..).flatten() {
            unix::close(fd);
        }
    }
}

impl Beacon {
    /// Accepts and closes the probes waiting in the beacon's backlog.
    pub(crate) fn drain(&self) {
        for fd in self.fds.iter().flatten() {
            for _ in 0..DRAIN_PER_ACCEPT {
                let Some(probe) = unix::accept_one(fd.as_raw_fd()) else {
                    break;
                };
                // Whatever a prober sent beside it is taken and disposed
                // of, so that nothing of a stranger's is released later by
                // a close of ours that could wait on it.
                let mut scratch = [0u8; 64];
                while let Ok((n, fds)) = unix::recv_record(probe.as_raw_fd(), &mut scratch) {
                    let any = n > 0 || !fds.is_empty();
                    fds.into_iter().for_each(unix::dispose);
                    if !any {
                        break;
                    }
                }
                unix::close(probe);
            }
        }
    }
}

/// Makes the beacon of `port` for IP version `family` (4 or 6), or finds
/// another listener's: Ok(None) when the name is held (by another
/// listener of the port, or a squatter that connectors will see through).
fn bind(family: u8, port: u16) -> Result<Option<OwnedFd>, c_int> {
    let fd = unix::seqpacket()?;
    match unix::listen_at(
        fd.as_raw_fd(),
        &beacon_name(unix::euid(), family, port),
        BACKLOG,
    ) {
        Ok(()) => Ok(Some(fd)),
        Err(libc::EADDRINUSE) => {
            unix::close(fd);
            Ok(None)
        }
        Err(e) => {
            unix::close(fd);
            Err(e)
        }
    }
}

/// The listener `fd` just started listening on `port` (of `families`):
/// its beacon, which announces it for as long as it is held; None (and a
/// line in the log) when one could not be bound.
pub(crate) fn listening(fd: c_int, port: u16, families: &[u8]) -> Option<Beacon> {
    let mut beacon = Beacon { fds: Vec::new() };
    for &f in families {
        match bind(f, port) {
            Ok(b) => beacon.fds.push(b),
            Err(e) => {
                log_line!(
                    "fd {fd}: listener on port {port} stays on the kernel's TCP: no beacon ({})",
                    std::io::Error::from_raw_os_error(e)
                );
                return None;
            }
        }
    }
    Some(beacon)
}

/// What a connector found at a port's beacon.
pub(crate) enum Found {
    /// A listener of this user under the library.
    Ours,
    /// No beacon: no listener under the library.
    None,
    /// A beacon the connector does not believe, and why.
    Refused(String),
}

/// Looks for the beacon of `port` (IP version `family`) of this process's
/// user and checks with the kernel who made it.
pub(crate) fn find(family: u8, port: u16) -> Found {
    let me = unix::euid();
    let name = beacon_name(me, family, port);
    let fd = match unix::seqpacket() {
        Ok(fd) => fd,
        Err(e) => {
            return Found::Refused(format!(
                "no socket to probe the beacon: {}",
                std::io::Error::from_raw_os_error(e)
            ))
        }
    };
    let found = match unix::connect_to(fd.as_raw_fd(), &name) {
        Ok(()) => match unix::peer_cred(fd.as_raw_fd()) {
            Some(c) if c.uid == me => Found::Ours,
            Some(c) => Found::Refused(format!(
                "the beacon @{name} belongs to uid {} (pid {}), not to this user: a squatter",
                c.uid, c.pid
            )),
            None => Found::Refused(format!("the beacon @{name} has no credentials")),
        },
        Err(libc::ECONNREFUSED | libc::ENOENT) => Found::None,
        Err(libc::EAGAIN) => Found::Refused(format!(
            "the beacon @{name} is full (its listener accepts nothing)"
        )),
        Err(e) => Found::Refused(format!(
            "probing the beacon @{name}: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    };
    unix::close(fd);
    found
}
