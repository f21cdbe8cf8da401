//! What the relay reads of its host and of the descriptors a request
//! brings (the interface its flows take, the neighbour table, a socket's
//! owner, state and addresses), and what it does to a program's sockets
//! (a wake-up byte, a reset).

use crate::policy::{self, SocketFacts, XdpInterface};
use crate::request::Request;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use thiserror::Error;

/// Why the relay cannot take `--interface` for its flows.
#[derive(Debug, Error)]
pub enum InterfaceError {
    /// The host's interfaces could not be listed.
    #[error("getifaddrs: {0}")]
    List(nix::Error),
    /// No interface of that name.
    #[error("no such interface in this network namespace")]
    Missing,
    /// A loopback interface.
    #[error("a loopback interface carries no xdp flow to another host")]
    Loopback,
    /// Not exactly one IPv4 address.
    #[error("has {0} IPv4 addresses; the relay's flows need exactly one")]
    Ipv4Count(usize),
    /// No MAC address.
    #[error("has no MAC address")]
    NoMac,
}

/// What could not be read of a request's descriptors or of this host.
#[derive(Debug, Error)]
pub(crate) enum SocketError {
    /// The connection's descriptor is no TCP stream socket.
    #[error("the connection's descriptor is not a TCP socket")]
    NotTcp,
    /// The socket's own address.
    #[error("getsockname: {0}")]
    Sockname(nix::Error),
    /// The socket's peer address.
    #[error("getpeername: {0}")]
    Peername(nix::Error),
    /// A TCP socket whose addresses are not IP ones.
    #[error("the TCP socket is not an IP connection")]
    NotIp,
    /// A descriptor's owner.
    #[error("fstat: {0}")]
    Fstat(io::Error),
    /// The host's addresses.
    #[error("getifaddrs: {0}")]
    Interfaces(nix::Error),
}

/// Reads the interface the relay was started for: it must exist, not
/// be loopback, and have a MAC and exactly one IPv4 address.
pub(crate) fn read_interface(name: &str) -> Result<XdpInterface, InterfaceError> {
    use nix::net::if_::InterfaceFlags;
    let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
        .map_err(InterfaceError::List)?
        .filter(|a| a.interface_name == name)
        .collect();
    if addrs.is_empty() {
        return Err(InterfaceError::Missing);
    }
    if addrs
        .iter()
        .any(|a| a.flags.contains(InterfaceFlags::IFF_LOOPBACK))
    {
        return Err(InterfaceError::Loopback);
    }
    let v4: Vec<(std::net::Ipv4Addr, u8)> = addrs
        .iter()
        .filter_map(|a| {
            let ip = a.address.as_ref()?.as_sockaddr_in()?.ip();
            let mask = u32::from(a.netmask.as_ref()?.as_sockaddr_in()?.ip());
            let len = u8::try_from(mask.leading_ones()).ok()?;
            Some((ip, len))
        })
        .collect();
    let [(ip, prefix_len)] = v4.as_slice() else {
        return Err(InterfaceError::Ipv4Count(v4.len()));
    };
    let mac = addrs
        .iter()
        .find_map(|a| a.address.as_ref()?.as_link_addr()?.addr())
        .filter(|m| *m != [0; 6])
        .ok_or(InterfaceError::NoMac)?;
    Ok(XdpInterface {
        name: name.to_string(),
        ip: *ip,
        prefix_len: *prefix_len,
        mac,
    })
}

/// Most bytes of `/proc/net/arp` read (some 10 000 entries).
pub(crate) const MAX_ARP_BYTES: u64 = 1 << 20;

/// The MAC the kernel's neighbour table holds for `ip` on `dev`, if
/// it holds a complete entry.
pub(crate) fn neighbour(ip: IpAddr, dev: &str) -> Option<[u8; 6]> {
    use std::io::Read;
    let IpAddr::V4(ip) = ip else { return None };
    let mut text = String::new();
    let f = std::fs::File::open("/proc/net/arp").ok()?;
    f.take(MAX_ARP_BYTES).read_to_string(&mut text).ok()?;
    policy::neighbour_mac(&text, ip, dev)
}

/// Sends one wake-up byte on `fd` without waiting; whether it went.
pub(crate) fn send_byte(fd: RawFd) -> bool {
    let b = [1u8];
    // SAFETY: a one-byte buffer on the stack.
    let r = unsafe {
        libc::send(
            fd,
            b.as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    r == 1
}

/// The descriptor must be a TCP stream socket.
pub(crate) fn check_tcp(fd: RawFd) -> Result<(), SocketError> {
    let opt = |name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` is valid for writes of `len` bytes.
        let r =
            unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    if opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM)
        || opt(libc::SO_PROTOCOL) != Some(libc::IPPROTO_TCP)
    {
        return Err(SocketError::NotTcp);
    }
    Ok(())
}

pub(crate) fn tcp_addrs(fd: RawFd) -> Result<(IpAddr, IpAddr), SocketError> {
    let local = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd)
        .map_err(SocketError::Sockname)?;
    let peer = nix::sys::socket::getpeername::<nix::sys::socket::SockaddrStorage>(fd)
        .map_err(SocketError::Peername)?;
    let ip = |a: &nix::sys::socket::SockaddrStorage| -> Option<IpAddr> {
        if let Some(v4) = a.as_sockaddr_in() {
            return Some(IpAddr::V4(v4.ip()));
        }
        let v6 = a.as_sockaddr_in6()?.ip();
        Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
    };
    match (ip(&local), ip(&peer)) {
        (Some(l), Some(p)) => Ok((l, p)),
        _ => Err(SocketError::NotIp),
    }
}

/// The owner of the file or socket `fd` (`fstat`: a socket's is the
/// user whose process made it, or accepted it).
pub(crate) fn owner(fd: RawFd) -> Result<u32, SocketError> {
    // SAFETY: all-zero bytes are a valid stat; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(SocketError::Fstat(io::Error::last_os_error()));
    }
    Ok(st.st_uid)
}

/// Whether the TCP socket `fd` is an established connection, or one
/// whose peer closed its side only (`CLOSE_WAIT`: what the peer sent is
/// still there to read, as a connector whose listener answered and closed
/// before its direct request was refused still has the answer to fetch
/// over the relays). The first byte of `TCP_INFO` is the state.
pub(crate) fn established(fd: RawFd) -> bool {
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is valid for writes of `len` bytes; the kernel
    // copies at most that much of its `tcp_info`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    r == 0 && len >= 1 && (info[0] == TCP_ESTABLISHED || info[0] == TCP_CLOSE_WAIT)
}

/// `TCP_ESTABLISHED` of the kernel's TCP states (`include/net/tcp_states.h`).
pub(crate) const TCP_ESTABLISHED: u8 = 1;
/// `TCP_CLOSE_WAIT` of the same.
pub(crate) const TCP_CLOSE_WAIT: u8 = 8;

/// What the relay's rules look at of a request's descriptors and of
/// this host ([`policy::check_socket`] decides).
pub(crate) fn socket_facts(r: &Request) -> Result<SocketFacts, SocketError> {
    tcp_facts(r.tcp.as_raw_fd(), Some(r.region.as_raw_fd()))
}

/// What the relay's rules look at of a TCP socket `fd`, a region if the
/// request moves one, and this host.
pub(crate) fn tcp_facts(fd: RawFd, region: Option<RawFd>) -> Result<SocketFacts, SocketError> {
    check_tcp(fd)?;
    let socket_uid = owner(fd)?;
    let region_uid = region.map(owner).transpose()?;
    let unspecified = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let (established, (local, peer)) = match tcp_addrs(fd) {
        Ok(a) => (established(fd), a),
        Err(_) => (false, (unspecified, unspecified)),
    };
    let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
        .map_err(SocketError::Interfaces)?
        .collect();
    let ip_of = |a: &nix::ifaddrs::InterfaceAddress| -> Option<IpAddr> {
        let s = a.address.as_ref()?;
        if let Some(v4) = s.as_sockaddr_in() {
            return Some(IpAddr::V4(v4.ip()));
        }
        Some(IpAddr::V6(s.as_sockaddr_in6()?.ip()))
    };
    let own_addrs: Vec<IpAddr> = addrs.iter().filter_map(ip_of).collect();
    let local_interface = addrs
        .iter()
        .find(|a| ip_of(a) == Some(local))
        .map(|a| a.interface_name.clone());
    Ok(SocketFacts {
        socket_uid,
        region_uid,
        established,
        local,
        peer,
        local_interface,
        own_addrs,
    })
}

/// The receive queues of interface `name`, as the driver reports its
/// channels (`ETHTOOL_GCHANNELS` on a socket of this network namespace),
/// else `/sys/class/net/NAME/queues/rx-*`; 1 when neither can be read (no
/// queue for a direct connection then). The ioctl comes first because
/// `/sys` is the namespace's that mounted it: a relay started in a
/// namespace by `setns` alone (not `ip netns exec`) reads another
/// namespace's interface of the same name there.
pub(crate) fn rx_queues(name: &str) -> u16 {
    if let Some(n) = netgap_transport::host::receive_channels(name) {
        return n.max(1);
    }
    let dir = format!("/sys/class/net/{name}/queues");
    let n = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count()
        })
        .unwrap_or(1);
    u16::try_from(n).unwrap_or(u16::MAX).max(1)
}

/// Resets the TCP connection on `fd` (shared with the program): both
/// programs see an error.
pub(crate) fn reset_tcp(fd: RawFd) {
    // SAFETY: all-zero bytes are a valid sockaddr; AF_UNSPEC
    // disconnects a TCP socket, sending a reset.
    let mut a: libc::sockaddr = unsafe { std::mem::zeroed() };
    a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: `a` is a valid sockaddr of its size.
    unsafe {
        libc::connect(
            fd,
            &raw const a,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
}
