//! A connection's shared region: made by the connector (a memfd sealed
//! against shrinking, growing and further seals, so the listener's mapping
//! can never turn into SIGBUS), and taken by the listener from the process
//! the kernel says is the connector, checked before anything of it is
//! mapped.

use crate::channel::{Channel, Role};
use crate::real;
use libc::c_int;
use netgap_proto::preload::Refusal;
use netgap_shm::region_bytes;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use thiserror::Error;

/// The memfd name every region carries (`/proc/self/fd` shows it as
/// `/memfd:netgap-preload (deleted)`).
const NAME: &std::ffi::CStr = c"netgap-preload";
/// What `/proc/self/fd/N` links to for a region.
const LINK_PREFIX: &str = "/memfd:netgap-preload";
/// The seals a region carries.
const SEALS: c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A region descriptor of this process, closed on drop (with the C
/// library's `close`): the mappings keep the memory.
pub(crate) struct Region(pub(crate) c_int);

impl Drop for Region {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: the region's descriptor, owned here and closed once.
            unsafe { real::close()(self.0) };
        }
    }
}

impl Region {
    /// The descriptor, no longer closed on drop (the caller owns it).
    pub(crate) fn into_raw(mut self) -> c_int {
        std::mem::replace(&mut self.0, -1)
    }
}

/// Why a region was not made, or one taken from the connector is not
/// mapped.
#[derive(Debug, Error)]
pub(crate) enum RegionError {
    /// No memfd.
    #[error("memfd_create: {0}")]
    Memfd(std::io::Error),
    /// The memfd could not be sized or sealed.
    #[error("sizing the region: {0}")]
    Size(std::io::Error),
    /// The rings could not be mapped (or the taken header is not this
    /// layout's).
    #[error("mapping the region: {0}")]
    Map(std::io::Error),
    /// The taken descriptor could not be looked at.
    #[error("fstat: {0}")]
    Fstat(std::io::Error),
    /// The taken descriptor is no regular file.
    #[error("the descriptor is not a regular file")]
    NotFile,
    /// The taken descriptor is no memfd of the library's name.
    #[error("the descriptor is not a region of the library's (a memfd of its name)")]
    NotOurs,
    /// Another user's, unsealed, or of another size.
    #[error("the region is not a sealed file of this user of the announced size")]
    NotSealed,
}

/// Makes a region of `ring`-byte rings and maps it as its maker.
pub(crate) fn make(ring: u32) -> Result<(Channel, Region), RegionError> {
    let total = region_bytes(ring as usize);
    // SAFETY: a NUL-terminated name and plain flags.
    let mfd =
        unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if mfd < 0 {
        return Err(RegionError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor nothing else owns.
    let mfd = crate::unix::lift(unsafe { OwnedFd::from_raw_fd(mfd) }).into_raw_fd();
    let region = Region(mfd);
    // SAFETY: plain calls on our own memfd.
    let sized = unsafe {
        libc::ftruncate(mfd, total as libc::off_t) == 0
            && libc::fcntl(mfd, libc::F_ADD_SEALS, SEALS) == 0
    };
    if !sized {
        return Err(RegionError::Size(std::io::Error::last_os_error()));
    }
    let ch = Channel::map(mfd, ring as usize, Role::Connector).map_err(RegionError::Map)?;
    Ok((ch, region))
}

/// Takes the region of `ring`-byte rings of the connection with ends `e`
/// (this end, the listener's, first) from its connector, checks it and
/// maps it as the listener. Who the connector is comes from the kernel
/// alone: the TCP peer's socket and its owner (the kernel's socket
/// diagnostics), and the process that bound the connection's mailbox
/// (`SO_PEERPIDFD`, `SO_PEERCRED`), which must be this process's user;
/// `region_fd`, the hello's, only says which of that process's
/// descriptors to look at, and is taken (`pidfd_getfd`: a duplicate,
/// nothing is opened) only if the kernel shows a memfd of the library's
/// there. Nothing of another user's is ever taken.
pub(crate) fn take_from_peer(
    e: &crate::diag::Ends,
    ring: u32,
    region_fd: u32,
) -> Result<(Channel, Region), (Refusal, String)> {
    let me = crate::unix::euid();
    let sock =
        crate::diag::tcp_socket(e.1, e.0).map_err(|why| (Refusal::Unreachable, why.to_string()))?;
    if sock.inode == 0 {
        // The kernel keeps a closed socket's connection (an orphan) until
        // its end is through: the connector is gone.
        return Err((
            Refusal::Unreachable,
            "the connector closed its socket".into(),
        ));
    }
    if sock.uid != me {
        return Err((
            Refusal::OtherUser,
            format!(
                "the connector's socket is uid {}'s, not this user's",
                sock.uid
            ),
        ));
    }
    let pidfd = connector_pidfd(sock.inode)?;
    let taken = take_fd(&pidfd, region_fd);
    crate::unix::close(pidfd);
    let fd = taken?;
    let (ch, region) = take(fd, ring).map_err(|why| (Refusal::BadRegion, why.to_string()))?;
    if ch.connector_ino() != sock.inode {
        return Err((
            Refusal::BadRegion,
            "the region names another connection than this one".into(),
        ));
    }
    if !ch.join() {
        return Err((
            Refusal::BadRegion,
            "the region is already joined to another connection".into(),
        ));
    }
    Ok((ch, region))
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the peer's process.
const SO_PEERPIDFD: c_int = 77;

/// A pidfd of the process that bound the mailbox of the connection whose
/// connector's socket has inode `ino`, which must be this process's
/// user's.
fn connector_pidfd(ino: u64) -> Result<OwnedFd, (Refusal, String)> {
    let name = netgap_proto::preload::mailbox_name(ino);
    let m = crate::unix::seqpacket().map_err(|err| {
        (
            Refusal::Unreachable,
            format!(
                "no socket to reach the connector's mailbox: {}",
                std::io::Error::from_raw_os_error(err)
            ),
        )
    })?;
    let fail = |m: OwnedFd, r: Refusal, why: String| {
        crate::unix::close(m);
        Err((r, why))
    };
    if let Err(err) = crate::unix::connect_to(m.as_raw_fd(), &name) {
        return fail(
            m,
            Refusal::Unreachable,
            format!(
                "the connector's mailbox @{name}: {}",
                std::io::Error::from_raw_os_error(err)
            ),
        );
    }
    let Some(cred) = crate::unix::peer_cred(m.as_raw_fd()) else {
        return fail(
            m,
            Refusal::Unreachable,
            "the connector's mailbox has no credentials".into(),
        );
    };
    if cred.uid != crate::unix::euid() {
        return fail(
            m,
            Refusal::OtherUser,
            format!(
                "the connector's mailbox is uid {}'s (pid {}), not this user's",
                cred.uid, cred.pid
            ),
        );
    }
    let mut pfd: c_int = -1;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `pfd` is valid for writes of `len` bytes.
    let r = unsafe {
        real::getsockopt()(
            m.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            std::ptr::from_mut(&mut pfd).cast(),
            &mut len,
        )
    };
    crate::unix::close(m);
    if (r != 0 || pfd < 0) && cred.pid > 0 {
        // Before Linux 6.5: the pid the kernel gave, opened at once.
        // SAFETY: a plain pidfd_open of a pid from the kernel.
        pfd = unsafe { libc::syscall(libc::SYS_pidfd_open, cred.pid, 0) } as c_int;
    }
    if pfd < 0 {
        return Err((
            Refusal::Unreachable,
            format!(
                "the connector's process {}: {}",
                cred.pid,
                std::io::Error::last_os_error()
            ),
        ));
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(pfd) })
}

/// Duplicates descriptor `n` of the process `pidfd` into this one if the
/// kernel shows a region of the library's there.
fn take_fd(pidfd: &OwnedFd, n: u32) -> Result<OwnedFd, (Refusal, String)> {
    let pid = pid_of(pidfd).ok_or((
        Refusal::Unreachable,
        "the connector's process is gone".to_string(),
    ))?;
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{n}"))
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !link.starts_with(LINK_PREFIX) {
        return Err((
            Refusal::BadRegion,
            format!("the connector's descriptor {n} is not a region of the library's"),
        ));
    }
    // SAFETY: pidfd_getfd on our pidfd; the result is checked and owned.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) } as c_int;
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::EPERM) {
            " (the kernel lets a process take another's descriptors only where it may trace it: is kernel.yama.ptrace_scope above 0?)"
        } else {
            ""
        };
        return Err((
            Refusal::Unreachable,
            format!("taking the connector's region: {e}{hint}"),
        ));
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// The pid a pidfd stands for, from its fdinfo; None once the process is
/// gone.
fn pid_of(pidfd: &OwnedFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|&p| p > 0)
}

/// Checks a descriptor taken from the connector as the region of
/// `ring`-byte rings, and maps it as the listener: it must be a memfd of
/// the library's (by its name), of this process's user, sealed, of
/// exactly the size the rings need, with a header of this version.
/// Returns the channel and the region's descriptor (which the connection
/// keeps).
fn take(fd: OwnedFd, ring: u32) -> Result<(Channel, Region), RegionError> {
    // SAFETY: all-zero bytes are a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(RegionError::Fstat(std::io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        crate::unix::dispose(fd);
        return Err(RegionError::NotFile);
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !link.starts_with(LINK_PREFIX) {
        crate::unix::close(fd);
        return Err(RegionError::NotOurs);
    }
    // SAFETY: a plain fcntl on the received descriptor.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    let total = region_bytes(ring as usize);
    if st.st_uid != crate::unix::euid()
        || st.st_size != total as libc::off_t
        || seals < 0
        || seals & SEALS != SEALS
    {
        crate::unix::close(fd);
        return Err(RegionError::NotSealed);
    }
    let region = Region(std::os::fd::IntoRawFd::into_raw_fd(fd));
    let ch = Channel::map(region.0, ring as usize, Role::Listener).map_err(RegionError::Map)?;
    Ok((ch, region))
}
