//! `xdp`: user-level networking over AF_XDP, the modern form of VIA (seed
//! 004's M-VIA row). The kernel leaves the data path: each flow endpoint
//! owns a UMEM (registered memory) and its four rings (fill, completion,
//! RX, TX: the descriptor and completion queues), posts descriptors and
//! rings the doorbell (a `sendto` wake-up) itself, and reaps completions.
//! The XDP program that steers frames to the socket is libxdp's default
//! program, loaded by libxdp when the socket is made.
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
//! IP and sends to the MAC. Two hosts are needed: on one interface (or
//! loopback) the two ends would share its queue. While a flow is open,
//! every frame arriving on the interface's queue goes to the socket (the
//! default program redirects the whole queue), so the control connection
//! must not use that interface (a testbed's agents use Unix sockets).
//!
//! Mode: libxdp attaches its program in the driver (native XDP) when the
//! driver allows, else at the generic hook; frames are always copied
//! (`XDP_COPY`): veth has no zero-copy, and the measurement should be the
//! same on any interface. The socket binds queue 0.
//!
//! Built only with the `xdp` cargo feature (libxdp and libbpf); without it
//! the transport is listed, unavailable, with the reason.

pub mod auth;
pub mod reliable;

#[cfg(feature = "xdp")]
mod flow;
#[cfg(feature = "xdp")]
mod sys;

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

/// Parses `IP/MAC/FLOW`.
pub fn parse_addr(s: &str) -> Result<XdpAddr, String> {
    let mut parts = s.split('/');
    let (Some(ip), Some(mac), Some(flow), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("expected IP/MAC/FLOW".into());
    };
    let ip: IpAddr = ip.parse().map_err(|e| format!("{e}"))?;
    let mac = parse_mac(mac)?;
    let flow: u16 = flow
        .parse()
        .ok()
        .filter(|&f| f != 0)
        .ok_or("the flow id must be 1..65535")?;
    Ok(XdpAddr { ip, mac, flow })
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<reliable::Mac, String> {
    let mut mac = [0u8; 6];
    let mut n = 0;
    for (i, part) in s.trim().split(':').enumerate() {
        if i >= 6 || part.len() != 2 {
            return Err(format!("bad MAC address {s:?}"));
        }
        mac[i] = u8::from_str_radix(part, 16).map_err(|_| format!("bad MAC address {s:?}"))?;
        n += 1;
    }
    if n != 6 {
        return Err(format!("bad MAC address {s:?}"));
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

/// Frames of each endpoint's UMEM (half receive, half transmit).
const FRAMES: u32 = 4096;
/// Bytes of a UMEM frame.
const FRAME_BYTES: u32 = 4096;
/// Entries of each ring.
const RING_ENTRIES: u32 = 2048;
/// Bytes the receiver holds unread (its credit).
const WINDOW_BYTES: usize = 4 << 20;
/// Bytes of one ring entry at most (a completion or fill entry is a u64
/// address; an RX or TX descriptor is 16 bytes).
const RING_ENTRY_BYTES: u64 = 16;

/// What one endpoint commits besides the point's message buffers: its UMEM
/// (registered with the kernel, so resident for the flow's life), its four
/// rings, and the receive window it may hold unread.
const ENDPOINT_MEMORY_BYTES: u64 = FRAMES as u64 * FRAME_BYTES as u64
    + 4 * RING_ENTRIES as u64 * RING_ENTRY_BYTES
    + WINDOW_BYTES as u64;

impl Transport for Xdp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "user-level networking over AF_XDP (UMEM, rings, libxdp's program; reliable delivery of its own; two hosts)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::cross_host_stream(&[])
    }

    fn availability(&self) -> Result<(), Unavailable> {
        probe()
    }

    fn runs_on_loopback(&self) -> bool {
        false
    }

    fn ip_port_addresses(&self) -> bool {
        false
    }

    fn flow_memory_bytes(&self) -> u64 {
        ENDPOINT_MEMORY_BYTES
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
            detail,
        })?;
        probe().map_err(|why| TransportError::Connect {
            transport: NAME,
            addr: addr.to_string(),
            source: std::io::Error::other(why.0),
        })?;
        imp::connect(config, a, None)
    }

    /// Each flow of a workload over several links (`multirail`) takes the
    /// interface that holds its own link's address.
    fn binds_local(&self) -> bool {
        true
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
            detail,
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
    //! The endpoints: interface lookup, UMEM shape, handshake.
    use super::flow::{Endpoint, Peer, Shared, XdpFlow};
    use super::reliable::{Mac, ETH_HEADER_BYTES, FRAME_OVERHEAD_BYTES};
    use super::sys::{Attach, Shape, Xsk};
    use super::*;
    use std::io;
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
                format!("no random bytes for an initial sequence number: {e}"),
            )
        })?;
        Ok(u32::from_ne_bytes(b))
    }

    /// A fresh flow id and initial sequence number, both random, so a
    /// host that does not see the flow's frames cannot guess them.
    fn flow_id_and_isn() -> io::Result<(u16, u32)> {
        let id = (random_u32()? as u16).max(1);
        Ok((id, random_u32()?))
    }

    /// Opens an endpoint on `ifc`: native XDP first, the generic hook if
    /// the driver refuses.
    fn endpoint(ifc: &Iface) -> io::Result<Endpoint> {
        if ifc.mtu + ETH_HEADER_BYTES > FRAME_BYTES as usize {
            return Err(io::Error::other(format!(
                "{} has MTU {}; xdp frames hold at most {} bytes",
                ifc.name,
                ifc.mtu,
                FRAME_BYTES as usize - ETH_HEADER_BYTES
            )));
        }
        let shape = Shape {
            frames: FRAMES,
            frame_bytes: FRAME_BYTES,
            ring_entries: RING_ENTRIES,
        };
        // The kernel frees a closed socket's hold on the queue a little
        // after the close (deferred work): a socket of the previous flow
        // may still hold it, so a busy queue is waited for.
        let t0 = Instant::now();
        let busy = |e: &io::Error| e.raw_os_error() == Some(libc::EBUSY);
        let xsk = loop {
            let native = match Xsk::open(&ifc.name, 0, shape, Attach::Native) {
                Ok(x) => break x,
                Err(e) => e,
            };
            let generic = match Xsk::open(&ifc.name, 0, shape, Attach::Generic) {
                Ok(x) => break x,
                Err(e) => e,
            };
            if (busy(&native) || busy(&generic)) && t0.elapsed() < QUEUE_BUSY_WAIT {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            return Err(io::Error::new(
                generic.kind(),
                format!(
                    "no XDP socket on {} queue 0 (native: {native}; generic: {generic}); is libxdp's default program installed (libxdp1), and is no other AF_XDP socket bound there?",
                    ifc.name
                ),
            ));
        };
        let mss = ifc.mtu + ETH_HEADER_BYTES - FRAME_OVERHEAD_BYTES;
        let (flow, isn) = flow_id_and_isn()?;
        Endpoint::new(xsk, FRAMES, (ifc.mac, flow), mss, WINDOW_BYTES, isn)
    }

    struct XdpListener {
        ip: IpAddr,
        iface: Iface,
        ep: Option<Endpoint>,
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
        let ep = endpoint(&ifc).map_err(err)?;
        let flow = ep_flow(&ep);
        Ok(Box::new(XdpListener {
            ip: local_ip,
            iface: ifc,
            ep: Some(ep),
            flow,
            config: config.clone(),
        }))
    }

    fn ep_flow(ep: &Endpoint) -> u16 {
        ep.local_flow()
    }

    impl Listener for XdpListener {
        fn addr(&self) -> String {
            XdpAddr {
                ip: self.ip,
                mac: self.iface.mac,
                flow: self.flow,
            }
            .to_string()
        }

        fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
            let err = |source| TransportError::Listen {
                transport: NAME,
                source,
            };
            let mut ep = match self.ep.take() {
                Some(ep) => ep,
                // A stranger's flow took the endpoint: a new one, on the
                // same flow id, for the next client.
                None => {
                    let mut ep = endpoint(&self.iface).map_err(err)?;
                    ep.set_local_flow(self.flow);
                    ep
                }
            };
            let t0 = Instant::now();
            loop {
                ep.pump()
                    .map_err(|e| err(io::Error::other(e.to_string())))?;
                if ep
                    .accept_syn()
                    .map_err(|e| err(io::Error::other(e.to_string())))?
                {
                    break;
                }
                if t0.elapsed() >= timeout {
                    self.ep = Some(ep);
                    return Err(TransportError::AcceptTimeout {
                        transport: NAME,
                        timeout_ms: timeout.as_millis(),
                    });
                }
                idle(&self.config);
            }
            let shared = Shared::new(ep, self.config.mode, self.config.io_timeout).map_err(err)?;
            Ok(Box::new(XdpFlow::new(shared)))
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
        let mut ep = endpoint(&ifc).map_err(err)?;
        let peer = Peer {
            mac: a.mac,
            flow: a.flow,
        };
        let t0 = Instant::now();
        let mut last_syn: Option<Instant> = None;
        while !ep.connected() {
            if t0.elapsed() >= CONNECT_TIMEOUT {
                return Err(err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no answer from {addr} on {} within {} ms",
                        ifc.name,
                        CONNECT_TIMEOUT.as_millis()
                    ),
                )));
            }
            if last_syn.is_none_or(|t| t.elapsed() >= SYN_EVERY) {
                ep.syn(peer)
                    .map_err(|e| err(io::Error::other(e.to_string())))?;
                last_syn = Some(Instant::now());
            }
            ep.pump()
                .map_err(|e| err(io::Error::other(e.to_string())))?;
            idle(config);
        }
        let shared = Shared::new(ep, config.mode, config.io_timeout).map_err(err)?;
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
