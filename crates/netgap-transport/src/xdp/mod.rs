//! `xdp`: user-level networking over AF_XDP, the modern form of VIA (seed
//! 004's M-VIA row). The kernel leaves the data path: a process holds one
//! *port* per interface (an AF_XDP socket with its UMEM, registered
//! memory, and its four rings: fill, completion, RX, TX, the descriptor
//! and completion queues), posts descriptors and rings the doorbell (a
//! `sendto` wake-up) itself, and reaps completions. Every xdp flow of the
//! process on that interface is a *session* on the port (`flow.rs`):
//! frames carry both ends' flow ids, and arrivals go to their session by
//! destination flow id ([`demux`], plain code), so one process holds many
//! flows on one interface at once. The XDP program that steers frames to
//! the socket is netgap's own (`steer.rs`): it takes frames of netgap's
//! EtherType and passes every other frame to the kernel, so the host's IP
//! traffic on the interface (an agent's control connection, ARP) goes on
//! while the port is open. It is attached through a BPF link when the port
//! is made and goes when the port closes with its last flow or listener,
//! or when the process dies.
//!
//! Frames are raw Ethernet frames of netgap's own small protocol
//! ([`reliable`], plain code): sequence numbers, acknowledgments,
//! credit-based flow control, retransmission after a timeout, and
//! messages larger than a frame split and reassembled, over a byte stream
//! each way. `poll` mode spins on the rings; `event` mode sleeps in poll()
//! on the socket.
//!
//! Addressing: the agent's listener binds the interface that holds the
//! address the control connection arrived on and names itself
//! `IP/MAC/FLOW`; the client binds the interface whose subnet holds that
//! IP and sends to the MAC. A listener's SYN opens a session with a flow
//! id of its own, which the answer names; the listener's id stays for the
//! next client. Two hosts are needed: on one interface (or loopback) the
//! two ends would share its queue, and one process's port holds an
//! interface for the process (another process's socket or program cannot
//! take it meanwhile). The control connection may share the interface
//! with the flows: only netgap's frames go to the socket.
//!
//! Mode: the program is attached in the driver (native XDP) when the
//! driver allows, else at the generic hook; frames are always copied
//! (`XDP_COPY`): veth has no zero-copy, and the measurement should be the
//! same on any interface. The socket binds queue 0, which the steering
//! program gives every netgap frame; the other queues are for sockets
//! another process makes and hands over, one connection each, whose
//! frames the program checks (`steer.rs`, `handover.rs`; how a frame keeps
//! its queue across a switch is `queue_path`'s). On such a handed port,
//! `direct` carries one program's connection to another host, driven by
//! the program's own nonblocking calls. The port changes
//! nothing else of the interface (queues, offloads, MTU); native XDP on a
//! veth makes the kernel turn its peer's TCP segmentation offload off while
//! the program is attached, and back on after.
//!
//! Built only with the `xdp` cargo feature (libxdp and libbpf); without it
//! the transport is listed, unavailable, with the reason. The `xdp-user`
//! feature alone builds the user side of a handed port (`handover`,
//! `direct`, the flow engine and the rings), with no C library: what the
//! preload library needs.

pub mod auth;
pub mod demux;
pub mod queue_path;
pub mod reliable;
// Plain code, but only the port's setup uses it.
#[cfg_attr(
    not(feature = "xdp"),
    allow(dead_code, reason = "loaded only with the xdp feature")
)]
mod steer;

#[cfg(feature = "xdp-user")]
pub mod direct;
#[cfg(feature = "xdp-user")]
#[cfg_attr(
    not(feature = "xdp"),
    allow(
        dead_code,
        unused_imports,
        reason = "the transport's own ports, shared by many flows, are the xdp feature's; the user side runs one connection's"
    )
)]
mod flow;
#[cfg(feature = "xdp-user")]
pub mod handover;
#[cfg(feature = "xdp-user")]
mod sys;

pub use steer::ConnId;
#[cfg(feature = "xdp-user")]
pub use sys::Shape;
#[cfg(feature = "xdp")]
pub use sys::{Registration, Steering};

use super::{Capabilities, Flow, FlowConfig, Listener, Transport, TransportError, Unavailable};
use std::net::IpAddr;

const NAME: &str = "xdp";

/// User-level networking over AF_XDP.
pub struct Xdp;

/// Where a listener is reached: `IP/MAC/FLOW`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpAddr {
    /// The listener's IP address (to choose the client's interface).
    pub ip: IpAddr,
    /// The listener's interface MAC.
    pub mac: reliable::Mac,
    /// The listener's flow id.
    pub flow: u16,
}

impl std::fmt::Display for XdpAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.mac;
        write!(
            f,
            "{}/{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}/{}",
            self.ip, m[0], m[1], m[2], m[3], m[4], m[5], self.flow
        )
    }
}

/// Why a text is no xdp address, `IP/MAC/FLOW`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// Not three parts separated by `/`.
    #[error("expected IP/MAC/FLOW")]
    Shape,
    /// The first part is no IP address.
    #[error(transparent)]
    Ip(#[from] std::net::AddrParseError),
    /// The second part is no MAC address.
    #[error(transparent)]
    Mac(#[from] MacError),
    /// The third part is no flow id.
    #[error("the flow id must be 1..65535")]
    FlowId,
}

/// A text that is no MAC address, `aa:bb:cc:dd:ee:ff`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad MAC address {text:?}")]
pub struct MacError {
    /// The text as given.
    pub text: String,
}

/// Parses `IP/MAC/FLOW`.
pub fn parse_addr(s: &str) -> Result<XdpAddr, AddrError> {
    let mut parts = s.split('/');
    let (Some(ip), Some(mac), Some(flow), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AddrError::Shape);
    };
    let ip: IpAddr = ip.parse()?;
    let mac = parse_mac(mac)?;
    let flow: u16 = flow
        .parse()
        .ok()
        .filter(|&f| f != 0)
        .ok_or(AddrError::FlowId)?;
    Ok(XdpAddr { ip, mac, flow })
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<reliable::Mac, MacError> {
    let bad = || MacError {
        text: s.to_string(),
    };
    let mut mac = [0u8; 6];
    let mut n = 0;
    for (i, part) in s.trim().split(':').enumerate() {
        if i >= 6 || part.len() != 2 {
            return Err(bad());
        }
        mac[i] = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        n += 1;
    }
    if n != 6 {
        return Err(bad());
    }
    Ok(mac)
}

/// Whether this build, this process and this kernel can make AF_XDP
/// sockets, or why not.
fn probe() -> Result<(), Unavailable> {
    if !cfg!(feature = "xdp") {
        return Err(Unavailable(
            "netgap was built without the xdp feature (cargo build --features xdp, with libxdp-dev and libbpf-dev installed)".into(),
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Unavailable(
            "AF_XDP sockets and XDP programs need root (CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF)"
                .into(),
        ));
    }
    // SAFETY: socket() with constant arguments; the result is closed at
    // once below.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        return Err(Unavailable(format!(
            "the kernel has no AF_XDP sockets ({e}; kernel {}; AF_XDP needs 4.18 or later with CONFIG_XDP_SOCKETS)",
            release.trim()
        )));
    }
    // SAFETY: `fd` is the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    Ok(())
}

/// Frames of each port's UMEM (half receive, half transmit).
const FRAMES: u32 = 4096;
/// Bytes of a UMEM frame.
const FRAME_BYTES: u32 = 4096;
/// Entries of each ring.
const RING_ENTRIES: u32 = 2048;
/// Bytes each session's receiver holds unread (its credit).
const WINDOW_BYTES: usize = 4 << 20;
/// Bytes of one ring entry at most (a completion or fill entry is a u64
/// address; an RX or TX descriptor is 16 bytes).
const RING_ENTRY_BYTES: u64 = 16;

/// What one flow commits besides the point's message buffers when it is
/// alone on its port (as a point's flow is): the port's UMEM (registered
/// with the kernel, so resident while the port is open), its four rings,
/// and the receive window the flow may hold unread.
const ENDPOINT_MEMORY_BYTES: u64 = FRAMES as u64 * FRAME_BYTES as u64
    + 4 * RING_ENTRIES as u64 * RING_ENTRY_BYTES
    + WINDOW_BYTES as u64;

impl Transport for Xdp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "user-level networking over AF_XDP (UMEM, rings, a program that steers only its own frames; reliable delivery of its own; two hosts)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            runs_on_loopback: false,
            ip_port_addresses: false,
            // Each flow of a workload over several links (`multirail`)
            // takes the interface that holds its own link's address.
            binds_local: true,
            // Programs under the sockets library reach other hosts'
            // programs through their hosts' relays, over this transport.
            programs: crate::Programs::LibraryWithRelay,
            framing: Some(crate::Framing::Xdp),
            ..Capabilities::cross_host_stream(crate::options::XDP)
        }
    }

    fn availability(&self) -> Result<(), Unavailable> {
        probe()
    }

    fn flow_memory_bytes(&self) -> u64 {
        ENDPOINT_MEMORY_BYTES
    }

    fn parse_listen_addr(&self, addr: &str) -> Result<crate::ListenAddr, crate::ListenAddrError> {
        let a = parse_addr(addr).map_err(|source| crate::ListenAddrError::Xdp {
            addr: addr.to_string(),
            source,
        })?;
        Ok(crate::ListenAddr::new(a.ip, a.to_string()))
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        probe().map_err(|why| TransportError::Listen {
            transport: NAME,
            source: std::io::Error::other(why.0),
        })?;
        imp::listen(config, local_ip)
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        let a = parse_addr(addr).map_err(|detail| TransportError::BadAddress {
            transport: NAME,
            addr: addr.to_string(),
            detail: detail.to_string(),
        })?;
        probe().map_err(|why| TransportError::Connect {
            transport: NAME,
            addr: addr.to_string(),
            source: std::io::Error::other(why.0),
        })?;
        imp::connect(config, a, None)
    }

    fn connect_from(
        &self,
        config: &FlowConfig,
        addr: &str,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Flow>, TransportError> {
        let a = parse_addr(addr).map_err(|detail| TransportError::BadAddress {
            transport: NAME,
            addr: addr.to_string(),
            detail: detail.to_string(),
        })?;
        probe().map_err(|why| TransportError::Connect {
            transport: NAME,
            addr: addr.to_string(),
            source: std::io::Error::other(why.0),
        })?;
        imp::connect(config, a, Some(local_ip))
    }
}

#[cfg(not(feature = "xdp"))]
mod imp {
    //! Without the feature, `probe` refuses before these are reached.
    use super::*;

    pub(super) fn listen(_: &FlowConfig, _: IpAddr) -> Result<Box<dyn Listener>, TransportError> {
        Err(TransportError::Unsupported {
            transport: NAME,
            what: "run in a build without the xdp feature",
        })
    }

    pub(super) fn connect(
        _: &FlowConfig,
        _: XdpAddr,
        _: Option<IpAddr>,
    ) -> Result<Box<dyn Flow>, TransportError> {
        Err(TransportError::Unsupported {
            transport: NAME,
            what: "run in a build without the xdp feature",
        })
    }
}

#[cfg(feature = "xdp")]
mod imp {
    //! The ports and flows: interface lookup, UMEM shape, handshake.
    use super::flow::{Peer, Port, PortIo, PortKey, Shared, XdpFlow};
    use super::reliable::{Mac, ETH_HEADER_BYTES, FRAME_OVERHEAD_BYTES};
    use super::sys::{Shape, Xsk};
    use super::*;
    use std::io;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// How long a client tries to open a flow.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    /// How long a busy queue (a socket just closed) is waited for.
    const QUEUE_BUSY_WAIT: Duration = Duration::from_secs(2);
    /// How often a client sends its opening again.
    const SYN_EVERY: Duration = Duration::from_millis(50);

    /// An interface: name, MAC, MTU.
    struct Iface {
        name: String,
        mac: Mac,
        mtu: usize,
    }

    /// Interface `name` of this thread's network namespace. Its MAC comes
    /// from netlink (getifaddrs) and its MTU from an ioctl, not from /sys,
    /// which shows the namespace it was mounted in: a coordinator that
    /// entered a testbed host's namespace would read the machine's own
    /// interface of the same name there.
    fn iface(name: String) -> io::Result<Iface> {
        use nix::ifaddrs::getifaddrs;
        let mac = getifaddrs()
            .map_err(io::Error::from)?
            .filter(|a| a.interface_name == name)
            .find_map(|a| a.address?.as_link_addr()?.addr())
            .ok_or_else(|| io::Error::other(format!("{name} has no MAC address")))?;
        let mtu = crate::host::read_mtu_ioctl(&name)
            .ok_or_else(|| io::Error::other(format!("cannot read the MTU of {name}")))?;
        Ok(Iface {
            name,
            mac,
            mtu: mtu as usize,
        })
    }

    /// The interface that holds `ip` (`exact`), or whose subnet holds it.
    fn find_iface(ip: IpAddr, exact: bool) -> io::Result<Iface> {
        use nix::ifaddrs::getifaddrs;
        let addrs = getifaddrs().map_err(io::Error::from)?;
        for a in addrs {
            let (Some(addr), Some(mask)) = (a.address, a.netmask) else {
                continue;
            };
            let (Some(addr), Some(mask), IpAddr::V4(want)) =
                (addr.as_sockaddr_in(), mask.as_sockaddr_in(), ip)
            else {
                continue;
            };
            let have = addr.ip();
            let m = u32::from(mask.ip());
            let hit = if exact {
                have == want
            } else {
                u32::from(have) & m == u32::from(want) & m
            };
            if hit {
                return iface(a.interface_name);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no interface {} {ip} (xdp runs over IPv4-addressed Ethernet interfaces)",
                if exact { "has" } else { "reaches" }
            ),
        ))
    }

    /// Four bytes from the kernel's random source.
    fn random_u32() -> io::Result<u32> {
        let mut b = [0u8; 4];
        crate::random::fill_random(&mut b).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("no random bytes for a flow id or initial sequence number: {e}"),
            )
        })?;
        Ok(u32::from_ne_bytes(b))
    }

    /// The process's port on `ifc`, opened (native XDP first, the generic
    /// hook if the driver refuses) if it has none.
    fn port(ifc: &Iface) -> io::Result<Arc<Port>> {
        if ifc.mtu + ETH_HEADER_BYTES > FRAME_BYTES as usize {
            return Err(io::Error::other(format!(
                "{} has MTU {}; xdp frames hold at most {} bytes",
                ifc.name,
                ifc.mtu,
                FRAME_BYTES as usize - ETH_HEADER_BYTES
            )));
        }
        let key = PortKey::here(&ifc.name)?;
        Port::get(key, || open_port(ifc), random_u32)
    }

    /// Opens the socket of a port on `ifc`; returns it with the payload
    /// per frame and the receive window of its sessions.
    fn open_port(ifc: &Iface) -> io::Result<(PortIo, usize, usize)> {
        let shape = Shape {
            frames: FRAMES,
            frame_bytes: FRAME_BYTES,
            ring_entries: RING_ENTRIES,
        };
        // The kernel frees a closed socket's hold on the queue a little
        // after the close (deferred work): the socket of the port just
        // closed may still hold it, so a busy queue is waited for.
        let t0 = Instant::now();
        let busy = |e: &io::Error| e.kind() == io::ErrorKind::ResourceBusy;
        let xsk = loop {
            match Xsk::open(&ifc.name, 0, shape) {
                Ok(x) => break x,
                Err(e) if busy(&e) && t0.elapsed() < QUEUE_BUSY_WAIT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "no XDP socket on {} queue 0 ({e}); is no other process's AF_XDP socket or XDP program on it?",
                            ifc.name
                        ),
                    ))
                }
            }
        };
        let mss = ifc.mtu + ETH_HEADER_BYTES - FRAME_OVERHEAD_BYTES;
        Ok((PortIo::new(xsk, FRAMES, ifc.mac)?, mss, WINDOW_BYTES))
    }

    struct XdpListener {
        ip: IpAddr,
        mac: Mac,
        port: Arc<Port>,
        flow: u16,
        config: FlowConfig,
    }

    pub(super) fn listen(
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let err = |source| TransportError::Listen {
            transport: NAME,
            source,
        };
        if local_ip.is_loopback() || local_ip.is_unspecified() {
            return Err(err(io::Error::other(format!(
                "xdp moves Ethernet frames between two hosts and cannot listen on {local_ip}: run it between hosts (--hosts, e.g. a testbed)"
            ))));
        }
        let ifc = find_iface(local_ip, true).map_err(err)?;
        let port = port(&ifc).map_err(err)?;
        let flow = port.listen().map_err(err)?;
        Ok(Box::new(XdpListener {
            ip: local_ip,
            mac: ifc.mac,
            port,
            flow,
            config: config.clone(),
        }))
    }

    impl Listener for XdpListener {
        fn addr(&self) -> String {
            XdpAddr {
                ip: self.ip,
                mac: self.mac,
                flow: self.flow,
            }
            .to_string()
        }

        fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
            let err = |source| TransportError::Listen {
                transport: NAME,
                source,
            };
            let t0 = Instant::now();
            let id = loop {
                self.port
                    .pump()
                    .map_err(|e| err(io::Error::other(e.to_string())))?;
                if let Some(id) = self.port.accept(self.flow) {
                    break id;
                }
                if t0.elapsed() >= timeout {
                    return Err(TransportError::AcceptTimeout {
                        transport: NAME,
                        timeout_ms: timeout.as_millis(),
                    });
                }
                idle(&self.config);
            };
            let shared = Shared::new(
                Arc::clone(&self.port),
                id,
                self.config.mode,
                self.config.io_timeout,
            )
            .map_err(|e| err(io::Error::other(e.to_string())))?;
            Ok(Box::new(XdpFlow::new(shared)))
        }
    }

    impl Drop for XdpListener {
        fn drop(&mut self) {
            self.port.unlisten(self.flow);
        }
    }

    /// A pause between two pumps while opening a flow.
    fn idle(config: &FlowConfig) {
        match config.mode {
            netgap_core::spec::Mode::Poll => std::hint::spin_loop(),
            netgap_core::spec::Mode::Event => std::thread::sleep(Duration::from_micros(100)),
        }
    }

    /// Opens a flow to `a` from the interface whose subnet holds its IP,
    /// or, given `local_ip`, from the interface that holds that address
    /// (a flow of a multi-link workload, on its own link), which must
    /// reach `a` on its subnet.
    pub(super) fn connect(
        config: &FlowConfig,
        a: XdpAddr,
        local_ip: Option<IpAddr>,
    ) -> Result<Box<dyn Flow>, TransportError> {
        let addr = a.to_string();
        let err = |source| TransportError::Connect {
            transport: NAME,
            addr: addr.clone(),
            source,
        };
        let flow_err = |e: crate::FlowError| err(io::Error::other(e.to_string()));
        let ifc = match local_ip {
            None => find_iface(a.ip, false).map_err(err)?,
            Some(local) => {
                let ifc = find_iface(local, true).map_err(err)?;
                let reaching = find_iface(a.ip, false).map_err(err)?;
                if reaching.name != ifc.name {
                    return Err(err(io::Error::other(format!(
                        "{local} is on {}, but {} is reached on {}: a flow's local address must be on the link to its target",
                        ifc.name, a.ip, reaching.name
                    ))));
                }
                ifc
            }
        };
        if a.mac == ifc.mac {
            // A frame sent on an interface leaves it; it does not come
            // back to the same socket.
            return Err(err(io::Error::other(format!(
                "{addr} is on this host's own interface {}: xdp's two ends need two hosts",
                ifc.name
            ))));
        }
        let port = port(&ifc).map_err(err)?;
        let peer = Peer {
            mac: a.mac,
            flow: a.flow,
        };
        let id = port.open_session(peer).map_err(flow_err)?;
        let t0 = Instant::now();
        let mut last_syn = Instant::now();
        loop {
            if let Err(e) = port.pump() {
                port.remove(id);
                return Err(flow_err(e));
            }
            if port.connected(id) {
                break;
            }
            if t0.elapsed() >= CONNECT_TIMEOUT {
                port.remove(id);
                return Err(err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no answer from {addr} on {} within {} ms",
                        ifc.name,
                        CONNECT_TIMEOUT.as_millis()
                    ),
                )));
            }
            if last_syn.elapsed() >= SYN_EVERY {
                if let Err(e) = port.syn_again(id) {
                    port.remove(id);
                    return Err(flow_err(e));
                }
                last_syn = Instant::now();
            }
            idle(config);
        }
        let shared = Shared::new(port, id, config.mode, config.io_timeout).map_err(flow_err)?;
        Ok(Box::new(XdpFlow::new(shared)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_ones_are_refused() {
        let a = XdpAddr {
            ip: "10.77.0.1".parse().unwrap(),
            mac: [0x02, 0xab, 0, 0x10, 0xff, 1],
            flow: 4660,
        };
        let s = a.to_string();
        assert_eq!(s, "10.77.0.1/02:ab:00:10:ff:01/4660");
        assert_eq!(parse_addr(&s).unwrap(), a);
        let l = Xdp.parse_listen_addr(&s).unwrap();
        assert_eq!((l.ip(), l.as_str()), (a.ip, s.as_str()));
        assert!(Xdp.parse_listen_addr("10.77.0.1:80").is_err());
        for bad in [
            "10.77.0.1:80",
            "10.77.0.1/02:ab:00:10:ff/1",
            "10.77.0.1/02:ab:00:10:ff:01/0",
            "x/02:ab:00:10:ff:01/1",
            "10.77.0.1/02:ab:00:10:ff:01/1/2",
            "10.77.0.1/02:ab:00:10:ff:zz/1",
        ] {
            assert!(parse_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_transport_says_why_it_is_unavailable() {
        if let Err(why) = Xdp.availability() {
            assert!(!why.0.is_empty());
        }
        if !cfg!(feature = "xdp") {
            let e = Xdp.availability().unwrap_err();
            assert!(e.0.contains("xdp feature"), "{e}");
        }
    }
}
