//! Connections kept across `exec`. A program may clear close-on-exec on a
//! taken-over connection's descriptor and exec another image (a server
//! that hands a connection to a handler it execs, inetd-style): the kernel
//! socket survives, but the library's table and the mapping of the rings
//! do not. The region's file survives with it, since each connection keeps
//! it with the close-on-exec flag of the connection's descriptors
//! (`interpose::sync_cloexec`), and the region's header names
//! the inodes of both ends' sockets. So when the library is loaded into
//! the new image, before the program's `main`, it looks at the descriptors
//! it was given: each region file whose socket is among them is mapped
//! again and the socket's descriptors (and their duplicates) are a
//! connection on that channel once more, reading and writing where the
//! old image left off. A region file whose socket did not survive (it was
//! close-on-exec) is closed.
//!
//! A direct connection (the `xdp` feature) cannot be kept: the
//! transport's state is in the old image's memory and its AF_XDP socket
//! is close-on-exec. Its marker (a small file named
//! [`DIRECT_MARKER_NAME`] holding the socket's inode, with the
//! close-on-exec flag of the connection's descriptors) tells the new
//! image which inherited socket was one: the library shuts it down, with
//! one log line, so the program reads its end and its writes fail
//! (`EPIPE`) instead of waiting on a socket nothing comes to.
//!
//! An image that runs without the library (its environment cleared of
//! `LD_PRELOAD`) cannot use the channel: its reads would see the doorbell
//! bytes on the kernel socket. That is a limit of a preload library, as
//! for a program that execs a static binary.

use crate::channel::{read_header, Channel, Role};
use crate::conn::Conn;
use crate::log::log_line;
use crate::real;
use crate::table::{self, Entry};
use libc::{c_int, c_ulong};
use std::sync::Arc;

/// The name `/proc/self/fd` shows for a region's file.
const REGION_LINK_PREFIX: &str = "/memfd:netgap-preload";
/// The name of a direct connection's marker file.
#[cfg(feature = "xdp")]
pub(crate) const DIRECT_MARKER_NAME: &std::ffi::CStr = c"netgap-direct";
/// The name `/proc/self/fd` shows for a direct connection's marker.
const DIRECT_LINK_PREFIX: &str = "/memfd:netgap-direct";

/// Finds the connections this image inherited and takes them over again.
pub(crate) fn adopt() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let mut regions: Vec<c_int> = Vec::new();
    let mut markers: Vec<c_int> = Vec::new();
    let mut sockets: Vec<(c_int, u64)> = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<c_int>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let link = link.to_string_lossy();
        if link.starts_with(REGION_LINK_PREFIX) {
            regions.push(fd);
        } else if link.starts_with(DIRECT_LINK_PREFIX) {
            markers.push(fd);
        } else if let Some(ino) = link
            .strip_prefix("socket:[")
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|n| n.parse::<u64>().ok())
        {
            sockets.push((fd, ino));
        }
    }
    for rfd in regions {
        adopt_region(rfd, &sockets);
    }
    for mfd in markers {
        end_direct(mfd, &sockets);
    }
}

/// Shuts down the inherited sockets a direct connection's marker `mfd`
/// names (see the module's notes), and closes the marker.
fn end_direct(mfd: c_int, sockets: &[(c_int, u64)]) {
    let mut ino = [0u8; 8];
    // SAFETY: `ino` is valid for writes of its length; `mfd` is the
    // marker this image inherited.
    let n = unsafe { libc::pread(mfd, ino.as_mut_ptr().cast(), ino.len(), 0) };
    close(mfd);
    if n != ino.len() as isize {
        return;
    }
    let ino = u64::from_le_bytes(ino);
    for &(fd, _) in sockets.iter().filter(|&&(_, i)| ino != 0 && i == ino) {
        log_line!("fd {fd}: a direct connection does not survive exec (its transport's state stayed in the old image): shut down");
        // SAFETY: a plain shutdown of the inherited socket.
        unsafe { real::shutdown()(fd, libc::SHUT_RDWR) };
    }
}

/// Maps the region `rfd` again for the socket descriptors among `sockets`
/// that are one of its ends, or closes it if none is.
fn adopt_region(rfd: c_int, sockets: &[(c_int, u64)]) {
    let Some(h) = read_header(rfd) else {
        close(rfd);
        return;
    };
    let mine = |ino: u64| -> Vec<c_int> {
        sockets
            .iter()
            .filter(|&&(_, i)| ino != 0 && i == ino)
            .map(|&(fd, _)| fd)
            .collect()
    };
    let (role, fds) = match (mine(h.connector_ino), mine(h.listener_ino)) {
        (c, _) if !c.is_empty() => (Role::Connector, c),
        (_, l) if !l.is_empty() => (Role::Listener, l),
        _ => {
            close(rfd);
            return;
        }
    };
    let Some(&fd) = fds.first() else {
        return;
    };
    let ch = match Channel::reattach(rfd, h.capacity, role) {
        Ok(ch) => ch,
        Err(e) => {
            log_line!("fd {fd}: a connection kept across exec cannot use its shared region ({e}); its reads see the kernel socket");
            close(rfd);
            return;
        }
    };
    // SAFETY: a plain fcntl on the inherited socket.
    let flags = unsafe { real::fcntl()(fd, libc::F_GETFL, 0) };
    let nonblocking = flags >= 0 && flags & libc::O_NONBLOCK != 0;
    let c = Arc::new(Conn::new(fd, ch, role, nonblocking, rfd));
    // The image before exec may have forked too: this process's close is
    // not known to be the last.
    c.set_shared();
    table::set_region(&c);
    for &d in &fds {
        table::set(d, Entry::Shm(c.clone()));
    }
    log_line!("fd {fd}: connection kept across exec, on shm again");
}

fn close(fd: c_int) {
    // SAFETY: a region file this image inherited and does not use.
    unsafe { real::close()(fd) };
}

/// Gives the region file of `c` the close-on-exec flag its descriptors
/// have: kept across exec only while some descriptor of the connection
/// is (so the image after exec can take the connection over again, see
/// `inherit`), closed on exec otherwise, so a program the process execs
/// (a CGI, as another user) holds nothing of connections it was not
/// given.
pub(crate) fn sync_cloexec(c: &Arc<Conn>) {
    let rfd = c.region_fd();
    if rfd < 0 {
        return;
    }
    let keep = table::descriptors_of(c).into_iter().any(|fd| {
        // SAFETY: a plain fcntl on the program's descriptor.
        let f = unsafe { real::fcntl()(fd, libc::F_GETFD, 0) };
        f >= 0 && f & libc::FD_CLOEXEC == 0
    });
    // SAFETY: plain fcntl calls on the connection's own region file.
    unsafe {
        let f = real::fcntl()(rfd, libc::F_GETFD, 0);
        if f >= 0 {
            let want = if keep {
                f & !libc::FD_CLOEXEC
            } else {
                f | libc::FD_CLOEXEC
            };
            if want != f {
                real::fcntl()(rfd, libc::F_SETFD, want as c_ulong);
            }
        }
    }
}
