//! How a stack puts its payload into frames on a link, as a testbed's
//! shaper counts them: the framing a transport declares, which the
//! physics of a record ([`crate::physics`]) reads to find a link's payload
//! limit.

use serde::{Deserialize, Serialize};

/// Ethernet header the shaper counts with every frame.
pub const ETH_HEADER_BYTES: u64 = 14;
/// IPv4 and TCP headers without options.
const IP_TCP_HEADER_BYTES: u64 = 40;
/// TCP timestamp option, padded (Linux enables timestamps by default).
const TCP_TIMESTAMP_BYTES: u64 = 12;
/// MPTCP DSS option with a 64-bit data ack and a 64-bit mapping, padded.
const MPTCP_DSS_BYTES: u64 = 28;
/// IPv4 header without options.
const IP_HEADER_BYTES: u64 = 20;
/// UDP header.
const UDP_HEADER_BYTES: u64 = 8;
/// netgap's own header on each udp datagram (`netgap_transport::udp`).
pub const NETGAP_UDP_HEADER_BYTES: u64 = 24;
/// netgap's own xdp frame header after the Ethernet header: its fields and
/// the 8-byte authentication tag (`netgap_transport::xdp::reliable`).
pub const NETGAP_XDP_HEADER_BYTES: u64 = 36;

/// How a stack puts payload into frames. A transport declares its own
/// (`netgap_transport::Capabilities::framing`) and every record's stack
/// carries it, so the physics of a record never reads a transport's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// Kernel TCP with timestamps.
    Tcp,
    /// Kernel MPTCP: TCP with the DSS option on every data segment.
    Mptcp,
    /// netgap's udp: one datagram per message.
    Udp,
    /// netgap's xdp: raw Ethernet frames with its own header.
    Xdp,
}

impl Framing {
    /// The framing of a stack in a record written before stacks carried
    /// their framing, read from its transport's name and options as the
    /// netgap that wrote it did; `None` for stacks with no link (unix, shm,
    /// shared memory) or an unknown transport. Only old records and
    /// imported results, which name a kernel stack, are read this way.
    pub fn written_by_name(transport: &str, options: &[String]) -> Option<Framing> {
        match transport {
            "tcp" | "uring" => Some(Framing::Tcp),
            "mptcp" => Some(Framing::Mptcp),
            "udp" => Some(Framing::Udp),
            "xdp" => Some(Framing::Xdp),
            "mpi" if options.iter().any(|o| o == "btl=tcp") => Some(Framing::Tcp),
            _ => None,
        }
    }

    /// Whether one connection spreads over every link between its two
    /// hosts (MPTCP's subflows), so that the links it uses are not the one
    /// link a path names.
    pub fn spans_links(self) -> bool {
        self == Framing::Mptcp
    }

    /// Payload bytes and frame bytes (as the shaper counts them) of a
    /// message of `size_bytes` at `mtu_bytes`, for a long run of such
    /// messages; `None` for an MTU too small for the headers.
    pub fn payload_and_frame_bytes(self, mtu_bytes: u64, size_bytes: u64) -> Option<(u64, u64)> {
        let per_segment = |overhead: u64| -> Option<(u64, u64)> {
            let payload = mtu_bytes.checked_sub(overhead).filter(|&p| p > 0)?;
            Some((payload, mtu_bytes + ETH_HEADER_BYTES))
        };
        match self {
            Framing::Tcp => per_segment(IP_TCP_HEADER_BYTES + TCP_TIMESTAMP_BYTES),
            Framing::Mptcp => {
                per_segment(IP_TCP_HEADER_BYTES + TCP_TIMESTAMP_BYTES + MPTCP_DSS_BYTES)
            }
            Framing::Xdp => per_segment(NETGAP_XDP_HEADER_BYTES),
            Framing::Udp => {
                // One datagram per message; fragments carry a multiple of 8
                // bytes of it, each in its own IP packet and frame.
                let datagram = size_bytes.max(1) + NETGAP_UDP_HEADER_BYTES + UDP_HEADER_BYTES;
                let per_fragment = (mtu_bytes.checked_sub(IP_HEADER_BYTES)? / 8) * 8;
                if per_fragment == 0 {
                    return None;
                }
                let fragments = datagram.div_ceil(per_fragment);
                let frame = datagram + fragments * (IP_HEADER_BYTES + ETH_HEADER_BYTES);
                Some((size_bytes.max(1), frame))
            }
        }
    }
}
