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
//! bit, so they never collide. A connect to the other host's address with
//! another flow id means the other relay listens anew (it lost the link):
//! an idle link is then closed and reopened. A link with no connection for
//! 2 s closes (`LINK_CLOSE` both ways, its flow released); the next
//! request opens a new one.
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

use std::path::PathBuf;
use thiserror::Error;

#[cfg_attr(
    not(feature = "xdp"),
    allow(
        dead_code,
        reason = "the limits are the relay's, which runs only with xdp; they and their tests build without it"
    )
)]
mod limits;
#[cfg_attr(
    not(feature = "xdp"),
    allow(
        dead_code,
        reason = "the rules are the relay's, which runs only with xdp; they and their tests build without it"
    )
)]
mod policy;
pub mod probe;

// The relay's machinery, by seam: the Unix-socket server and its
// clients' credentials (`server`), the link table and the requests that
// open links (`hub`), one link and its threads (`link`) with its way out
// (`outbox`), a connection's pumps and credit (`conn`), the program's
// ring (`ring`), what is read of the host and of a request's descriptors
// (`host`), and the log lines (`journal`).
#[cfg(feature = "xdp")]
#[macro_use]
mod journal;
#[cfg(feature = "xdp")]
mod conn;
#[cfg(feature = "xdp")]
mod host;
#[cfg(feature = "xdp")]
mod hub;
#[cfg(feature = "xdp")]
mod link;
#[cfg(feature = "xdp")]
mod outbox;
#[cfg(feature = "xdp")]
mod ring;
#[cfg(feature = "xdp")]
mod server;

/// Flags of `netgap relay`.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// The interface the relay's xdp flows take (required): its xdp
    /// listens bind the interface's IPv4 address, and it opens flows only
    /// to addresses on the interface's subnet, at the MAC the kernel's
    /// neighbour table holds for each. Never the interface of the TCP
    /// connections it carries: while a flow is open, every frame of the
    /// interface's queue goes to the relay.
    #[arg(long, value_name = "NAME")]
    pub interface: Option<String>,
    /// The hosts whose connections the relay carries (required): their
    /// TCP addresses, each an address or a prefix, comma-separated
    /// (`10.77.0.2,10.78.0.0/16`). A connection to any other host, to this
    /// host or over loopback is refused.
    #[arg(long, value_name = "IP[/LEN],...", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// The relays' shared key (required): a key file as `netgap key new
    /// FILE` makes it (mode 0600), the same for every relay its programs
    /// reach. Each link between two relays is keyed from it and from what
    /// names the link.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Requests one user's programs may make a second (and at once):
    /// every connection to the relay's socket counts, a library's check
    /// that the relay runs too (a relayed connection costs its connector
    /// two).
    #[arg(long, default_value_t = 1000)]
    pub max_requests_per_uid: u32,
    /// Most connections one user's programs may have through the relay.
    #[arg(long, default_value_t = 16)]
    pub max_per_uid: u32,
    /// Most connections through the relay in all.
    #[arg(long, default_value_t = 64)]
    pub max_total: u32,
    /// Most links (other hosts' relays) held at once. Each is one flow on
    /// the interface's xdp port, which holds at most 256 flows and
    /// listeners.
    #[arg(long, default_value_t = 64)]
    pub max_links: u32,
    /// A link with no frame from the other relay for this long is broken
    /// (the relays send a keep-alive every third of it), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
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
    /// A bad flag.
    #[error("relay: {0}")]
    Flag(String),
    /// The relay's socket.
    #[error("relay: cannot listen on @netgap-relay: {0} (is another relay running in this network namespace?)")]
    Listen(std::io::Error),
    /// The key file.
    #[error("relay: --key: {0}")]
    Key(#[from] netgap_measure::auth::KeyFileError),
    /// The interface of `--interface`.
    #[error("relay: --interface {name}: {why}")]
    Interface {
        /// The interface named.
        name: String,
        /// What is wrong with it.
        why: String,
    },
}

/// The relay's flags, checked: what `imp::run` starts with.
#[cfg_attr(
    not(feature = "xdp"),
    allow(dead_code, reason = "read only by the relay, which runs only with xdp")
)]
struct Setup {
    interface: String,
    served: policy::Served,
    key: netgap_proto::auth::Key,
}

/// The most `--max-links` allows: half of the xdp port's flows, so that
/// the listens opening links always find room beside the links.
const MAX_LINKS: u32 = 128;

/// Runs the relay in the foreground until killed.
pub fn run(args: &RelayArgs) -> Result<(), RelayError> {
    if args.max_per_uid == 0 || args.max_total == 0 {
        return Err(RelayError::Flag(
            "--max-per-uid and --max-total must be at least 1".into(),
        ));
    }
    if !(1..=MAX_LINKS).contains(&args.max_links) {
        return Err(RelayError::Flag(format!(
            "--max-links {}: want 1 to {MAX_LINKS}",
            args.max_links
        )));
    }
    if !(300..=600_000).contains(&args.timeout_ms) {
        return Err(RelayError::Flag(format!(
            "--timeout-ms {}: want 300 to 600000",
            args.timeout_ms
        )));
    }
    if args.max_requests_per_uid == 0 {
        return Err(RelayError::Flag(
            "--max-requests-per-uid must be at least 1".into(),
        ));
    }
    let Some(interface) = args.interface.clone() else {
        return Err(RelayError::Flag(
            "--interface NAME is required: the interface the relay's xdp flows take, never the one its programs' TCP connections use".into(),
        ));
    };
    if args.peers.is_empty() {
        return Err(RelayError::Flag(
            "--peers is required: the hosts whose connections the relay carries, addresses or prefixes of their TCP addresses (--peers 10.77.0.0/24)".into(),
        ));
    }
    let served = policy::Served::parse(&args.peers).map_err(RelayError::Flag)?;
    let Some(key_file) = &args.key else {
        return Err(RelayError::Flag(
            "--key FILE is required: the links between relays are keyed from it (make one with `netgap key new FILE` and give every relay the same)".into(),
        ));
    };
    let key = netgap_measure::auth::load_key(key_file)?;
    start(
        args,
        Setup {
            interface,
            served,
            key,
        },
    )
}

/// How often waiting threads look again (a broken connection, the
/// linger, the program's doorbells).
#[cfg(feature = "xdp")]
pub(crate) const TICK: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(feature = "xdp")]
use server::run as start;

#[cfg(not(feature = "xdp"))]
fn start(_: &RelayArgs, _: Setup) -> Result<(), RelayError> {
    Err(RelayError::NoXdp)
}
