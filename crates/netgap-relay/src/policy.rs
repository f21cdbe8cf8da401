//! What the relay acts for, as plain code: the relay gathers the facts of
//! a request (the asker's uid from `SO_PEERCRED`, the TCP socket's and the
//! region's owners from `fstat`, the connection's state and addresses, this
//! host's addresses, the kernel's neighbour table) and these functions
//! decide, so the rules are tested without sockets.
//!
//! The rules: a request moves only a connected TCP socket and a region
//! that both belong to the asking user (root acts for root only), whose
//! peer is a host the relay serves (`--peers`), never this host itself nor
//! loopback, and whose connection does not run over the relay's xdp
//! interface (`--interface`: while a flow is open, that interface's queue
//! goes to the relay). A connect's target must be on that interface's
//! subnet, at the MAC the kernel's neighbour table holds for its address
//! on that interface. A link between two relays is keyed from the relays'
//! own key (`--key`) and what names the link, never from a connection.

use netgap_proto::auth::Key;
use netgap_proto::preload::RelayRequest;
use netgap_transport::xdp::{parse_addr, XdpAddr};
use std::net::{IpAddr, Ipv4Addr};
use thiserror::Error;

/// A `--peers` list the relay cannot serve; each message names the entry.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PeersError {
    /// An entry that is neither an address nor a prefix.
    #[error("--peers {0:?}: not an address or a prefix")]
    NotAddress(String),
    /// A prefix length past the address's bits.
    #[error("--peers {entry:?}: a prefix length of 0 to {max}")]
    PrefixLen {
        /// The entry as given.
        entry: String,
        /// The address's bits (32 or 128).
        max: u8,
    },
    /// Loopback, unspecified or multicast.
    #[error("--peers {0:?}: a relay carries connections to other hosts, never to a loopback, unspecified or multicast address")]
    NotAHost(String),
    /// Only empty entries.
    #[error("--peers names no host")]
    Empty,
}

/// Why the relay does not act on a request's socket: one short line (the
/// reply carries up to 64 characters of it).
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The TCP socket is another user's.
    #[error("the socket is uid {0}'s, not the asker's")]
    SocketOwner(u32),
    /// The region is another user's.
    #[error("the region is uid {0}'s, not the asker's")]
    RegionOwner(u32),
    /// Not an established TCP connection.
    #[error("the socket is not a connected TCP connection")]
    NotConnected,
    /// The peer is loopback or unspecified.
    #[error("the peer {0} is this host (loopback)")]
    Loopback(IpAddr),
    /// The peer is one of this host's addresses.
    #[error("the peer {0} is this host")]
    ThisHost(IpAddr),
    /// The peer is no host of `--peers`.
    #[error("the peer {0} is no host this relay serves")]
    Unserved(IpAddr),
    /// The connection runs over the relay's xdp interface.
    #[error("the connection runs over {0}, the xdp interface")]
    OverXdp(String),
}

/// Why a connect may not open a flow to its target.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum TargetError {
    /// An IPv6 target.
    #[error("target {0}: xdp links are IPv4")]
    NotIpv4(IpAddr),
    /// Off the interface's subnet, or the interface's own address.
    #[error("target {ip} is not on {iface}'s subnet")]
    OffSubnet {
        /// The target's address.
        ip: Ipv4Addr,
        /// The relay's xdp interface.
        iface: String,
    },
    /// Another MAC than the neighbour table's.
    #[error("target {0}: not the MAC the neighbour table has")]
    WrongMac(Ipv4Addr),
    /// No complete neighbour entry.
    #[error("target {0}: not in the neighbour table")]
    NoNeighbour(Ipv4Addr),
}

/// Why a request names no link.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum LinkIdError {
    /// A connect's target does not parse.
    #[error("target {target}: {why}")]
    Target {
        /// The target as the library sent it.
        target: String,
        /// Why it is no `IP/MAC/FLOW`.
        why: netgap_transport::xdp::AddrError,
    },
    /// A reservation.
    #[error("a reservation names no link")]
    Reservation,
}

/// Domain separation of a link's key, derived from the relay key.
pub(crate) const LINK_KEY_CONTEXT: &[u8] = b"netgap relay v1: link key";

/// The hosts a relay carries connections to and from (`--peers`): the
/// TCP addresses of their programs' connections, each an address or a
/// prefix (`10.77.0.0/24`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Served {
    nets: Vec<(IpAddr, u8)>,
}

impl Served {
    /// Parses `--peers` entries (`IP` or `IP/LEN`); Err: one line naming
    /// the entry.
    pub(crate) fn parse(list: &[String]) -> Result<Served, PeersError> {
        let mut nets = Vec::new();
        for entry in list.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (ip, len) = match entry.split_once('/') {
                Some((ip, len)) => (ip, Some(len)),
                None => (entry, None),
            };
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| PeersError::NotAddress(entry.to_string()))?;
            let ip = canonical(ip);
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                None => max,
                Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(|| {
                    PeersError::PrefixLen {
                        entry: entry.to_string(),
                        max,
                    }
                })?,
            };
            if ip.is_loopback() || ip.is_multicast() || (ip.is_unspecified() && len == max) {
                return Err(PeersError::NotAHost(entry.to_string()));
            }
            nets.push((ip, len));
        }
        if nets.is_empty() {
            return Err(PeersError::Empty);
        }
        Ok(Served { nets })
    }

    /// Whether `ip` is one of the served hosts.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets
            .iter()
            .any(|(net, len)| same_prefix(*net, ip, *len))
    }
}

impl std::fmt::Display for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (ip, len)) in self.nets.iter().enumerate() {
            let full = if ip.is_ipv4() { 32 } else { 128 };
            let sep = if i == 0 { "" } else { "," };
            if *len == full {
                write!(f, "{sep}{ip}")?;
            } else {
                write!(f, "{sep}{ip}/{len}")?;
            }
        }
        Ok(())
    }
}

/// An IPv4 address mapped into IPv6 as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `a` and `b` share their first `len` bits (never across IP
/// versions).
fn same_prefix(a: IpAddr, b: IpAddr, len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// The interface the relay was started for (`--interface`), as read once
/// when it starts: its one IPv4 address, prefix and MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XdpInterface {
    /// The interface's name.
    pub(crate) name: String,
    /// Its IPv4 address: where the relay's xdp listens bind.
    pub(crate) ip: Ipv4Addr,
    /// The length of its subnet's prefix.
    pub(crate) prefix_len: u8,
    /// Its MAC address.
    pub(crate) mac: [u8; 6],
}

impl XdpInterface {
    /// Whether `ip` is on the interface's subnet.
    pub(crate) fn on_subnet(&self, ip: IpAddr) -> bool {
        same_prefix(IpAddr::V4(self.ip), canonical(ip), self.prefix_len)
    }
}

/// What the relay read of a request's descriptors and of this host.
#[derive(Debug, Clone)]
pub(crate) struct SocketFacts {
    /// The TCP socket's owner (`fstat`: the user whose process made it).
    pub(crate) socket_uid: u32,
    /// The region's owner (none for a direct request, which moves no
    /// region).
    pub(crate) region_uid: Option<u32>,
    /// Whether the TCP connection is established.
    pub(crate) established: bool,
    /// The connection's local address.
    pub(crate) local: IpAddr,
    /// The connection's peer address.
    pub(crate) peer: IpAddr,
    /// The interface holding `local`, if one does.
    pub(crate) local_interface: Option<String>,
    /// Every address of this host (of every interface, loopback too).
    pub(crate) own_addrs: Vec<IpAddr>,
}

/// Whether the relay may act for the user `asker` (its client's
/// `SO_PEERCRED` uid) on a request's socket; Err: the reason, one short
/// line (the reply carries up to 64 characters of it).
pub(crate) fn check_socket(
    asker: u32,
    s: &SocketFacts,
    served: &Served,
    iface: &XdpInterface,
) -> Result<(), Refusal> {
    if s.socket_uid != asker {
        return Err(Refusal::SocketOwner(s.socket_uid));
    }
    if let Some(region_uid) = s.region_uid.filter(|&u| u != asker) {
        return Err(Refusal::RegionOwner(region_uid));
    }
    if !s.established {
        return Err(Refusal::NotConnected);
    }
    let peer = canonical(s.peer);
    if peer.is_loopback() || peer.is_unspecified() {
        return Err(Refusal::Loopback(peer));
    }
    if peer == canonical(s.local) || s.own_addrs.iter().any(|a| canonical(*a) == peer) {
        return Err(Refusal::ThisHost(peer));
    }
    if !served.contains(peer) {
        return Err(Refusal::Unserved(peer));
    }
    if s.local_interface.as_deref() == Some(iface.name.as_str())
        || IpAddr::V4(iface.ip) == canonical(s.local)
        || iface.on_subnet(peer)
    {
        return Err(Refusal::OverXdp(iface.name.clone()));
    }
    Ok(())
}

/// Whether a connect may open a flow to `t`: an IPv4 address on the
/// interface's subnet (not its own), at the MAC `neighbour` (the kernel's
/// neighbour table's complete entry for that address on the interface).
pub(crate) fn check_target(
    t: &XdpAddr,
    iface: &XdpInterface,
    neighbour: Option<[u8; 6]>,
) -> Result<(), TargetError> {
    let IpAddr::V4(ip) = canonical(t.ip) else {
        return Err(TargetError::NotIpv4(t.ip));
    };
    if !iface.on_subnet(IpAddr::V4(ip)) || ip == iface.ip {
        return Err(TargetError::OffSubnet {
            ip,
            iface: iface.name.clone(),
        });
    }
    match neighbour {
        Some(mac) if mac == t.mac => Ok(()),
        Some(_) => Err(TargetError::WrongMac(ip)),
        None => Err(TargetError::NoNeighbour(ip)),
    }
}

/// The MAC of the complete entry for `ip` on interface `dev` in the text
/// of `/proc/net/arp` (`IP address, HW type, Flags, HW address, Mask,
/// Device`); None when there is none (or it is incomplete: flags without
/// `ATF_COM`, or an all-zero address).
pub(crate) fn neighbour_mac(arp: &str, ip: Ipv4Addr, dev: &str) -> Option<[u8; 6]> {
    /// `ATF_COM`: the entry's address is resolved.
    const ATF_COM: u32 = 0x2;
    arp.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, _hw, flags, mac, _mask, device] = f.as_slice() else {
            return None;
        };
        if *device != dev || addr.parse::<Ipv4Addr>().ok()? != ip {
            return None;
        }
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        let mac = netgap_transport::xdp::parse_mac(mac).ok()?;
        (flags & ATF_COM != 0 && mac != [0; 6]).then_some(mac)
    })
}

/// What names a link between two relays, as both ends know it before it
/// is keyed: the listening end's `IP/MAC/FLOW` (in one spelling) and the
/// two hosts' TCP addresses, the listening host's first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkId {
    listening_end: String,
    listening_host: IpAddr,
    connecting_host: IpAddr,
}

impl LinkId {
    /// The link a request of a program names, in the view of this relay:
    /// a listen's, where `own_end` is the end this relay listens at (or
    /// holds the link at); a connect's, to its target. `tcp_local` and
    /// `tcp_peer` are the program's TCP connection's addresses. The
    /// request's key (the connection's, from its hello) is not part of it.
    pub(crate) fn of_request(
        req: &RelayRequest,
        own_end: &XdpAddr,
        tcp_local: IpAddr,
        tcp_peer: IpAddr,
    ) -> Result<LinkId, LinkIdError> {
        match req {
            RelayRequest::Listen { .. } => Ok(LinkId::listening(own_end, tcp_local, tcp_peer)),
            RelayRequest::Connect { target, .. } => {
                let t = parse_addr(target).map_err(|why| LinkIdError::Target {
                    target: target.clone(),
                    why,
                })?;
                Ok(LinkId::connecting(&t, tcp_local, tcp_peer))
            }
            RelayRequest::Reserve { .. } => Err(LinkIdError::Reservation),
        }
    }

    /// The link this relay listens for at `own_end`, for a program's
    /// connection from `tcp_local` to `tcp_peer`.
    pub(crate) fn listening(own_end: &XdpAddr, tcp_local: IpAddr, tcp_peer: IpAddr) -> LinkId {
        LinkId {
            listening_end: own_end.to_string(),
            listening_host: canonical(tcp_local),
            connecting_host: canonical(tcp_peer),
        }
    }

    /// The link to `target`, the other relay's end, for a program's
    /// connection from `tcp_local` to `tcp_peer`.
    pub(crate) fn connecting(target: &XdpAddr, tcp_local: IpAddr, tcp_peer: IpAddr) -> LinkId {
        LinkId {
            listening_end: target.to_string(),
            listening_host: canonical(tcp_peer),
            connecting_host: canonical(tcp_local),
        }
    }

    /// The key the link's flow is bound with: derived from the relays'
    /// own key and the link's names, so each link has its own and only a
    /// holder of the relay key makes it. No connection's key goes in: a
    /// program (or whoever reads its hello) never holds a link's key.
    pub(crate) fn flow_key(&self, relay_key: &Key) -> [u8; 32] {
        let ip = |a: IpAddr| match a {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        relay_key.derive(
            LINK_KEY_CONTEXT,
            &[
                self.listening_end.as_bytes(),
                &ip(self.listening_host),
                &ip(self.connecting_host),
            ],
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn served(list: &[&str]) -> Served {
        Served::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn iface() -> XdpInterface {
        XdpInterface {
            name: "eth1".into(),
            ip: "10.77.1.1".parse().unwrap(),
            prefix_len: 24,
            mac: [2, 0, 0, 0, 1, 1],
        }
    }

    /// A request as a user's own program makes it: uid 1000's socket and
    /// region, connected from eth0 to a served host.
    fn facts() -> SocketFacts {
        SocketFacts {
            socket_uid: 1000,
            region_uid: Some(1000),
            established: true,
            local: ip("10.77.0.1"),
            peer: ip("10.77.0.2"),
            local_interface: Some("eth0".into()),
            own_addrs: vec![ip("127.0.0.1"), ip("10.77.0.1"), ip("10.77.1.1")],
        }
    }

    #[test]
    fn peers_are_addresses_or_prefixes_and_nothing_local() {
        let s = served(&["10.77.0.0/24", "10.80.1.2", "fd00::/64"]);
        assert!(s.contains(ip("10.77.0.9")));
        assert!(s.contains(ip("::ffff:10.77.0.9")));
        assert!(s.contains(ip("10.80.1.2")));
        assert!(!s.contains(ip("10.80.1.3")));
        assert!(!s.contains(ip("10.77.1.9")));
        assert!(s.contains(ip("fd00::5")));
        assert!(!s.contains(ip("fd01::5")));
        assert_eq!(s.to_string(), "10.77.0.0/24,10.80.1.2,fd00::/64");
        assert!(served(&["0.0.0.0/0"]).contains(ip("192.0.2.1")));
        for bad in [
            "",
            "host",
            "10.0.0.1/33",
            "10.0.0.1/x",
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
        ] {
            assert!(
                Served::parse(&[bad.to_string()]).is_err(),
                "{bad:?} was taken"
            );
        }
    }

    #[test]
    fn only_the_askers_own_connected_socket_to_a_served_host_passes() {
        let s = served(&["10.77.0.0/24"]);
        assert_eq!(check_socket(1000, &facts(), &s, &iface()), Ok(()));
        // Another user's socket or region; root acts for root only.
        let e = check_socket(65534, &facts(), &s, &iface()).unwrap_err();
        assert!(e.to_string().contains("uid 1000's"), "{e}");
        let root = SocketFacts {
            socket_uid: 0,
            ..facts()
        };
        assert!(check_socket(0, &root, &s, &iface()).is_err());
        assert!(check_socket(1000, &root, &s, &iface()).is_err());
        let theirs = SocketFacts {
            region_uid: Some(0),
            ..facts()
        };
        assert!(check_socket(1000, &theirs, &s, &iface())
            .unwrap_err()
            .to_string()
            .contains("region"));
        // A direct request moves no region: its socket alone is checked.
        let direct = SocketFacts {
            region_uid: None,
            ..facts()
        };
        assert!(check_socket(1000, &direct, &s, &iface()).is_ok());
        assert!(check_socket(65534, &direct, &s, &iface()).is_err());
        let unconnected = SocketFacts {
            established: false,
            ..facts()
        };
        assert!(check_socket(1000, &unconnected, &s, &iface()).is_err());
    }

    #[test]
    fn loopback_same_host_and_unserved_peers_are_refused() {
        let s = served(&["10.77.0.0/24"]);
        let with_peer = |peer: &str, local: &str| SocketFacts {
            peer: ip(peer),
            local: ip(local),
            ..facts()
        };
        for (peer, local) in [
            ("127.0.0.1", "127.0.0.1"),
            ("::1", "::1"),
            ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ] {
            let e = check_socket(1000, &with_peer(peer, local), &s, &iface()).unwrap_err();
            assert!(e.to_string().contains("loopback"), "{e}");
        }
        // A served prefix holding this host's own address: still this host.
        let e = check_socket(1000, &with_peer("10.77.0.1", "10.77.0.1"), &s, &iface()).unwrap_err();
        assert!(e.to_string().contains("is this host"), "{e}");
        let own = SocketFacts {
            peer: ip("10.77.1.1"),
            ..facts()
        };
        assert!(check_socket(1000, &own, &served(&["10.77.0.0/16"]), &iface()).is_err());
        let e = check_socket(1000, &with_peer("10.78.0.2", "10.77.0.1"), &s, &iface()).unwrap_err();
        assert!(e.to_string().contains("no host this relay serves"), "{e}");
    }

    #[test]
    fn a_connection_over_the_xdp_interface_is_refused() {
        let s = served(&["10.77.0.0/16"]);
        let on_xdp = SocketFacts {
            local: ip("10.77.1.1"),
            peer: ip("10.77.1.2"),
            local_interface: Some("eth1".into()),
            ..facts()
        };
        let e = check_socket(1000, &on_xdp, &s, &iface()).unwrap_err();
        assert!(e.to_string().contains("eth1, the xdp interface"), "{e}");
        // A peer on the xdp subnet, whichever local address.
        let via = SocketFacts {
            peer: ip("10.77.1.2"),
            ..facts()
        };
        assert!(check_socket(1000, &via, &s, &iface()).is_err());
    }

    #[test]
    fn a_target_must_be_on_the_subnet_at_its_neighbour_entrys_mac() {
        let t = parse_addr("10.77.1.2/02:00:00:00:01:02/7").unwrap();
        let mac = Some([2, 0, 0, 0, 1, 2]);
        assert_eq!(check_target(&t, &iface(), mac), Ok(()));
        let e = check_target(&t, &iface(), Some([2, 0xde, 0xad, 0, 0, 1])).unwrap_err();
        assert!(e.to_string().contains("not the MAC"), "{e}");
        assert!(check_target(&t, &iface(), None)
            .unwrap_err()
            .to_string()
            .contains("not in the neighbour table"));
        for other in [
            "10.77.0.2/02:00:00:00:01:02/7",
            "10.77.1.1/02:00:00:00:01:02/7",
            "fd00::1/02:00:00:00:01:02/7",
        ] {
            let t = parse_addr(other).unwrap();
            assert!(check_target(&t, &iface(), mac).is_err(), "{other}");
        }
    }

    #[test]
    fn the_neighbour_table_gives_complete_entries_of_the_interface_only() {
        let arp = "\
IP address       HW type     Flags       HW address            Mask     Device
10.77.1.2        0x1         0x2         02:00:00:00:01:02     *        eth1
10.77.1.3        0x1         0x0         00:00:00:00:00:00     *        eth1
10.77.1.4        0x1         0x6         02:00:00:00:01:04     *        eth1
10.77.0.2        0x1         0x2         02:00:00:00:00:02     *        eth0
10.77.1.5        0x1         0x2         zz:00:00:00:01:05     *        eth1
garbage
";
        let n = |a: &str, dev| neighbour_mac(arp, a.parse().unwrap(), dev);
        assert_eq!(n("10.77.1.2", "eth1"), Some([2, 0, 0, 0, 1, 2]));
        assert_eq!(n("10.77.1.3", "eth1"), None);
        assert_eq!(n("10.77.1.4", "eth1"), Some([2, 0, 0, 0, 1, 4]));
        assert_eq!(n("10.77.0.2", "eth1"), None);
        assert_eq!(n("10.77.0.2", "eth0"), Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(n("10.77.1.5", "eth1"), None);
        assert_eq!(n("10.77.1.9", "eth1"), None);
        assert_eq!(
            neighbour_mac("", "10.77.1.2".parse().unwrap(), "eth1"),
            None
        );
    }

    /// A connection's key (the hello's, chosen by a program) never keys
    /// the link: both relays derive the link's key from the relay key and
    /// the link's names alone, and agree on it, whatever key the requests
    /// carry.
    #[test]
    fn a_link_is_keyed_from_the_relay_key_never_from_a_connection() {
        let relay_key = Key::from_bytes(vec![7; 32]).unwrap();
        let end = parse_addr("10.77.1.2/02:00:00:00:01:02/7").unwrap();
        let (server, client) = (ip("10.77.0.2"), ip("10.77.0.1"));
        let client_end = parse_addr("10.77.1.1/02:00:00:00:01:01/7").unwrap();
        let listen = |key| RelayRequest::Listen {
            ring_bytes: 4096,
            key,
        };
        // The connector's relay has the target in the spelling its
        // program passed on.
        let connect = |key| RelayRequest::Connect {
            ring_bytes: 4096,
            key,
            target: "10.77.1.2/02:00:00:00:01:02/0007".into(),
        };
        let id = LinkId::of_request(&listen([1; 32]), &end, server, client).unwrap();
        let k = id.flow_key(&relay_key);
        for hello_key in [[1u8; 32], [2; 32], [7; 32]] {
            let l = LinkId::of_request(&listen(hello_key), &end, server, client).unwrap();
            let c = LinkId::of_request(&connect(hello_key), &client_end, client, server).unwrap();
            assert_eq!((&l, &c), (&id, &id));
            let (lk, ck) = (l.flow_key(&relay_key), c.flow_key(&relay_key));
            assert_eq!((lk, ck), (k, k));
            assert_ne!(lk, hello_key);
        }
        // Another relay key, another flow or another host pair: another key.
        assert_ne!(k, id.flow_key(&Key::from_bytes(vec![8; 32]).unwrap()));
        let other_flow = parse_addr("10.77.1.2/02:00:00:00:01:02/8").unwrap();
        let l = |end, local, peer| {
            LinkId::of_request(&listen([1; 32]), end, local, peer)
                .unwrap()
                .flow_key(&relay_key)
        };
        assert_ne!(k, l(&other_flow, server, client));
        assert_ne!(k, l(&end, server, ip("10.77.0.3")));
        assert_ne!(k, l(&end, client, server));
        let reserve = RelayRequest::Reserve {
            ring_bytes: 4096,
            key: [1; 32],
        };
        assert!(LinkId::of_request(&reserve, &end, server, client).is_err());
    }
}
