//! `netgap relay`: the per-host process that carries the preload library's
//! connections to other hosts over xdp's reliable transport.
//!
//! An unprivileged program cannot open AF_XDP sockets, and one such socket
//! per interface queue cannot be shared by many processes, so the relay, a
//! root process, owns the xdp side for its host (network namespace), as a
//! kernel module owns SDP's offload. It listens on the abstract Unix
//! socket `netgap-relay` (private to the namespace); a wrapped program's
//! library hands it, per connection, the region it made (the ring pair of
//! a same-host connection, in a sealed memfd) and a duplicate of the
//! connection's TCP socket, and asks it either to listen for the
//! connection (the accepting side: the reply is the target `IP/MAC/FLOW`
//! the other relay reaches it at) or to carry it to a target (the
//! connecting side).
//!
//! One xdp flow, the *link*, joins two hosts' relays and carries every
//! relayed connection between them, multiplexed. A relay holds a link to
//! each host its programs talk to (at most `--max-links`), all of them
//! sessions on the one AF_XDP socket its process holds on its
//! `--interface` (the xdp transport's port), found by the other host's TCP
//! address: the peer address of the programs' connections, which both ends
//! know before any link exists. A request that would open a link past the
//! limit is refused, and the library keeps that connection on the kernel's
//! TCP (a listen) or resets it (a connect, the hellos having been
//! exchanged). A link's states: none; opening (a listen waits for the
//! other relay's flow, or a connect opens one; further requests for that
//! host wait for it, at most 4 s); up (frames go out in order on the
//! flow's one sending half: a connection's own thread sends its frame
//! itself when nothing is queued, sparing a thread's wake-up per message;
//! one thread sends what is queued, a keep-alive when idle, and the close;
//! one thread reads and dispatches frames by connection id, never waits on
//! a program nor on the flow, and queues what it sends). A listen names
//! this relay's end of the link (`IP/MAC/FLOW`, the flow id being the
//! listening end's, which both ends name; each end learns the other's from
//! the `LINK_HELLO` that opens the link) and waits for the other relay's
//! `OPEN` naming the connection's key; a connect to the link's peer sends
//! `OPEN` {id, key} and waits for `OPEN_OK` (or `OPEN_REFUSED`: no
//! connection waits with that key). Ids carry the opening end in their top
//! bit, so they never collide. A connect uses the link that ends at its
//! target, and opens one when none does, even while a listen of this
//! relay waits for the other's flow (both hosts' programs listened, then
//! connected to each other): the two relays then open a link each, and
//! while both are new they name the one whose connecting end is the lower
//! address, the other carrying what was opened on it until it closes. A
//! connect to a new end of a host whose link is settled means the other
//! relay listens anew (it lost the link): an idle link is then closed, a
//! busy one left to its timeout beside the new one. A link with no
//! connection for 2 s closes (`LINK_CLOSE` both ways, its flow released);
//! the next request opens a new one.
//!
//! Trust: the relay acts only for what the asker owns, toward the hosts
//! and over the interface it was started for; each rule is plain code
//! (`policy`). The asker is its client's `SO_PEERCRED` uid. A request
//! moves only a connected TCP socket and a region that are that user's
//! (their owners by `fstat`: the user whose process made or accepted the
//! socket, made the memfd; root acts for root only), whose peer is a
//! host the relay serves (`--peers`, addresses or prefixes; never this
//! host, never loopback), and whose connection does not run over the xdp
//! interface. The xdp interface is `--interface`, never a guess: its
//! IPv4 address is where the relay's xdp listens bind, and a connect's
//! target must be on its subnet, at the MAC the kernel's neighbour table
//! holds for the target's address on it (`/proc/net/arp`), so a program
//! cannot aim the relay's frames at a made-up MAC or another link. A
//! request that breaks a rule is refused before anything is mapped or
//! attached. Each link is keyed (`bind_session`) from the relays' own key
//! (`--key`, shared by the relays of a cluster) and what names the link
//! (the listening end's `IP/MAC/FLOW` and the two hosts' TCP addresses:
//! `policy::LinkId`), never from a connection's key, which a program
//! draws and sends in the clear in its hello: only relays holding the key
//! can open, feed or reset a link's connections. A connection's key
//! matches an `OPEN` to the listen waiting with it, and nothing else, so
//! a program cannot take another's connection. The relays trust each
//! other: a relay can open, feed and reset any connection whose key it
//! was given.
//!
//! Per connection, the relay pumps the program's ring to the link and
//! the link to the program's ring, in frames of 8-byte header (kind,
//! zero, length, connection id; their codec and the credit accounting
//! are `netgap_proto::relay`): data, a wake-up request, the end, credit,
//! a reset. Flow control is per connection: each receiving
//! relay grants 256 KiB at `OPEN`, puts what arrives straight into the
//! program's ring while nothing is queued and the ring has room (the ring
//! never blocks), queues the rest (a sender past its credit breaks the
//! link), and returns credit in batches as bytes reach the ring, a thread
//! per connection moving the queue; so a program that
//! reads slowly stalls only its own connection, and memory is bounded by
//! connections × 256 KiB. The program's doorbells arrive on its socket to
//! the relay. The relay wakes a program waiting in an epoll with a byte on
//! that same socket, which the library registers in the program's epoll
//! beside the connection (with the program's data) or adds to the set of
//! its poll or select, on this host; where the library could not watch
//! that socket, the program is woken by asking the other relay to send
//! one byte on the TCP connection, the only other thing that makes the
//! program's descriptor readable. The end: the program's last close
//! closes its relay socket; the relay sends what is left and an end
//! frame; the other relay delivers everything, then shuts the receiving
//! side of its TCP socket, which its program reads as the end of the
//! stream. A connection whose program broke its ring is reset (`RESET`
//! to the other relay), not the link. A broken link (the other relay
//! gone: no frame, not even a keep-alive, for the timeout; or a
//! malformed frame) resets every TCP connection on it, which the
//! programs see as an error.
//!
//! Limits: every request is one fixed-size record
//! (`netgap_proto::preload::RelayRequest`) with exactly a sealed memfd of
//! the announced size and a TCP socket; a client may make at most
//! `--max-requests-per-uid` requests a second (every connection to the
//! socket counts) and hold at most `--max-per-uid` connections
//! (`--max-total` in all), a relay at most `--max-links` links. Every
//! refusal is a `RelayReply::Refused` with the reason and one log line.
//! The lines a client's requests cause are held to a few a second per uid
//! (a burst of 20, then 5 a second), and what passes that is counted and
//! said in one line (`limits`): a client sending garbage writes a few
//! lines, never thousands. The lines of the other relay's `OPEN`s that no
//! listen waits for are held alike, per link. The lines of a connection
//! the other relay accepted (its close, its counters) are written as they
//! come; each needed a request. The xdp flow must not use the interface
//! the TCP connection uses (while a flow is open, every frame of that
//! interface's queue goes to the relay), so a host needs a second link.
//! Races the design leaves: a connection opening just as the other relay
//! closes an idle link, or the first connections both ways at once while
//! neither host has a link, fail (reset) instead of waiting; and a relay
//! that restarts while the other still holds their link has its first
//! connections to that host reset until the other relay's timeout breaks
//! the old link.
//!
//! Direct connections (`direct`; the protocol is `netgap_proto::direct`):
//! instead of carrying a connection, the relay may make its program an
//! AF_XDP socket of its own on a queue of the connection's own (agreed
//! with the other relay over their link: `QUEUE_OFFER`, `QUEUE_ANSWER`),
//! registered in the interface's steering for that connection's frames
//! only, and hand it over with a `DirectGrant` on the program's relay
//! socket; it keeps only the registration, until that socket hangs up.
//! `--no-direct` refuses them; a uid holds at most
//! `--max-direct-per-uid` queues, never every queue.
//!
//! This crate is the relay and nothing else: the `netgap` binary turns
//! `netgap relay`'s flags into [`RelayOptions`], reads the key, and calls
//! [`run`] with the [`RelayConfig`] they make. It sees the layers it
//! carries bytes through (`netgap-proto`'s requests, frames and credit,
//! `netgap-shm`'s regions, `netgap-transport`'s xdp flows) and nothing of
//! the measurement crates or the binary. Everything but [`run`] builds
//! without the `xdp` feature, so the link table, the flow control, the
//! limits and the rules are tested anywhere, without root.

use netgap_proto::auth::Key;
use std::time::Duration;
use thiserror::Error;

pub use host::InterfaceError;
pub use policy::PeersError;

// The relay's parts, by seam and in layers (a file takes only from those
// below it): the Unix-socket server and its clients' credentials
// (`server`) over the listen and connect requests (`open`), a link at
// work on the hub (`carry`: its hello, its receiving thread, the other
// relay's `OPEN`) over the hub (`hub`: the link table, `table`, and the
// listens waiting), one link (`link`) with its way out (`outbox`), a
// connection's pumps (`conn`) and its flow control (`credit`), the
// program's ring (`ring`), what is read of the host and of a request's
// descriptors (`host`) and the request itself (`request`), the log lines
// (`journal`), and the plain rules (`policy`) and limits (`limits`).
// Direct connections (`direct`, beside `open`): the request served, the
// queue agreed over the link, the port made, registered and handed over,
// with their plain parts, the meeting of the two halves by key
// (`rendezvous`) and the interface's queues (`queues`). All
// of it builds without the xdp feature, so its tests run anywhere; only
// `run` needs it.
#[macro_use]
mod journal;
mod carry;
mod conn;
mod credit;
mod direct;
mod host;
mod hub;
mod limits;
mod link;
mod open;
mod outbox;
mod policy;
mod probe;
mod queues;
mod rendezvous;
mod request;
mod ring;
mod server;
#[cfg(feature = "xdp")]
mod spares;
mod table;

/// The relay's settings as the command line gives them, unchecked
/// ([`RelayConfig::new`] checks them).
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The interface the relay's xdp flows take (`--interface`): its xdp
    /// listens bind the interface's IPv4 address, and it opens flows only
    /// to addresses on its subnet. Required.
    pub interface: Option<String>,
    /// The hosts whose connections the relay carries (`--peers`): their
    /// TCP addresses, each an address or a prefix (`10.78.0.0/16`).
    /// Required; never loopback.
    pub peers: Vec<String>,
    /// Requests one uid's programs may make a second, and at once
    /// (`--max-requests-per-uid`); at least 1.
    pub max_requests_per_uid: u32,
    /// Most connections one uid's programs may have through the relay
    /// (`--max-per-uid`); at least 1.
    pub max_per_uid: u32,
    /// Most connections through the relay in all (`--max-total`); at
    /// least 1.
    pub max_total: u32,
    /// Most links (other hosts' relays) held at once (`--max-links`); 1
    /// to [`MAX_LINKS`].
    pub max_links: u32,
    /// A link with no frame from the other relay for this long is broken
    /// (`--timeout-ms`), in milliseconds; 300 to 600 000.
    pub timeout_ms: u64,
    /// Whether the relay makes and hands over direct connections' AF_XDP
    /// sockets (`--direct`, the default; `--no-direct` refuses every
    /// direct request, and those connections stay on the relay's path).
    pub direct: bool,
    /// Most direct connections' queues one uid's programs may hold at
    /// once (`--max-direct-per-uid`); at least 1. Never every queue of an
    /// interface with two or more usable.
    pub max_direct_per_uid: u32,
}

/// What the relay runs with: checked settings and the relays' shared key.
#[derive(Debug)]
pub struct RelayConfig {
    interface: String,
    served: policy::Served,
    key: Key,
    max_requests_per_uid: u32,
    max_per_uid: u32,
    max_total: u32,
    max_links: usize,
    timeout: Duration,
    direct: bool,
    max_direct_per_uid: u32,
}

/// The most links a relay holds (`--max-links`): half of the xdp port's
/// flows, so that the listens opening links always find room beside the
/// links.
pub const MAX_LINKS: u32 = 128;

/// The shortest and the longest link timeout, in milliseconds.
const TIMEOUT_MS: std::ops::RangeInclusive<u64> = 300..=600_000;

/// Settings the relay cannot run with; each message names the flag.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `--max-per-uid` or `--max-total` is 0.
    #[error("relay: --max-per-uid and --max-total must be at least 1")]
    NoConnections,
    /// `--max-links` is out of range.
    #[error("relay: --max-links {0}: want 1 to {MAX_LINKS}")]
    MaxLinks(u32),
    /// `--timeout-ms` is out of range.
    #[error("relay: --timeout-ms {0}: want 300 to 600000")]
    Timeout(u64),
    /// `--max-requests-per-uid` is 0.
    #[error("relay: --max-requests-per-uid must be at least 1")]
    NoRequests,
    /// `--max-direct-per-uid` is 0.
    #[error("relay: --max-direct-per-uid must be at least 1 (turn direct connections off with --no-direct)")]
    NoDirect,
    /// No `--interface`.
    #[error("relay: --interface NAME is required: the interface the relay's xdp flows take, never the one its programs' TCP connections use")]
    NoInterface,
    /// No `--peers`.
    #[error("relay: --peers is required: the hosts whose connections the relay carries, addresses or prefixes of their TCP addresses (--peers 10.77.0.0/24)")]
    NoPeers,
    /// A `--peers` entry the relay cannot serve.
    #[error("relay: {0}")]
    Peers(PeersError),
}

impl RelayConfig {
    /// Checks `options` and takes the relays' shared key (`--key`, the
    /// same for every relay its programs reach: each link is keyed from
    /// it and from what names the link).
    pub fn new(options: RelayOptions, key: Key) -> Result<RelayConfig, ConfigError> {
        if options.max_per_uid == 0 || options.max_total == 0 {
            return Err(ConfigError::NoConnections);
        }
        if !(1..=MAX_LINKS).contains(&options.max_links) {
            return Err(ConfigError::MaxLinks(options.max_links));
        }
        if !TIMEOUT_MS.contains(&options.timeout_ms) {
            return Err(ConfigError::Timeout(options.timeout_ms));
        }
        if options.max_requests_per_uid == 0 {
            return Err(ConfigError::NoRequests);
        }
        if options.max_direct_per_uid == 0 {
            return Err(ConfigError::NoDirect);
        }
        let interface = options.interface.ok_or(ConfigError::NoInterface)?;
        if options.peers.is_empty() {
            return Err(ConfigError::NoPeers);
        }
        let served = policy::Served::parse(&options.peers).map_err(ConfigError::Peers)?;
        Ok(RelayConfig {
            interface,
            served,
            key,
            max_requests_per_uid: options.max_requests_per_uid,
            max_per_uid: options.max_per_uid,
            max_total: options.max_total,
            max_links: options.max_links as usize,
            timeout: Duration::from_millis(options.timeout_ms),
            direct: options.direct,
            max_direct_per_uid: options.max_direct_per_uid,
        })
    }
}

/// Why the relay could not run.
#[derive(Debug, Error)]
pub enum RelayError {
    /// Built without the xdp feature.
    #[error("relay: this netgap was built without the xdp feature (cargo build --features xdp)")]
    NoXdp,
    /// Not root.
    #[error("relay: must run as root (it opens AF_XDP sockets)")]
    NotRoot,
    /// The relay's socket.
    #[error("relay: cannot listen on @netgap-relay: {0} (is another relay running in this network namespace?)")]
    Listen(std::io::Error),
    /// The interface of `--interface`.
    #[error("relay: --interface {name}: {why}")]
    Interface {
        /// The interface named.
        name: String,
        /// What is wrong with it.
        why: InterfaceError,
    },
}

/// Runs the relay in the foreground until killed; returns only when it
/// cannot run.
pub fn run(config: RelayConfig) -> Result<(), RelayError> {
    if !cfg!(feature = "xdp") {
        return Err(RelayError::NoXdp);
    }
    server::run(config)
}

/// How often waiting threads look again (a broken connection, the
/// linger, the program's doorbells).
const TICK: Duration = Duration::from_millis(50);

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn options() -> RelayOptions {
        RelayOptions {
            interface: Some("eth1".into()),
            peers: vec!["10.0.1.0/24".into()],
            max_requests_per_uid: 1000,
            max_per_uid: 16,
            max_total: 64,
            max_links: 64,
            timeout_ms: 5000,
            direct: true,
            max_direct_per_uid: 4,
        }
    }

    fn key() -> Key {
        Key::from_bytes(vec![9; 32]).unwrap()
    }

    fn refused(change: impl FnOnce(&mut RelayOptions)) -> ConfigError {
        let mut o = options();
        change(&mut o);
        RelayConfig::new(o, key()).unwrap_err()
    }

    #[test]
    fn settings_out_of_range_are_refused_naming_the_flag() {
        let c = RelayConfig::new(options(), key()).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.max_links, 64);
        assert_eq!(refused(|o| o.max_total = 0), ConfigError::NoConnections);
        assert_eq!(refused(|o| o.max_links = 0), ConfigError::MaxLinks(0));
        assert_eq!(
            refused(|o| o.max_links = MAX_LINKS + 1),
            ConfigError::MaxLinks(MAX_LINKS + 1)
        );
        assert_eq!(refused(|o| o.timeout_ms = 299), ConfigError::Timeout(299));
        assert_eq!(
            refused(|o| o.max_requests_per_uid = 0),
            ConfigError::NoRequests
        );
        assert_eq!(refused(|o| o.interface = None), ConfigError::NoInterface);
        assert_eq!(refused(|o| o.max_direct_per_uid = 0), ConfigError::NoDirect);
        assert_eq!(refused(|o| o.peers.clear()), ConfigError::NoPeers);
        let e = refused(|o| o.peers = vec!["127.0.0.1".into()]);
        assert!(e.to_string().contains("never to a loopback"), "{e}");
        assert!(refused(|o| o.max_links = 0)
            .to_string()
            .contains("--max-links 0"));
    }
}
