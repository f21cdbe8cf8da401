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
    imp::run(
        args,
        Setup {
            interface,
            served,
            key,
        },
    )
}

#[cfg(not(feature = "xdp"))]
mod imp {
    use super::*;

    pub(super) fn run(_: &RelayArgs, _: Setup) -> Result<(), RelayError> {
        Err(RelayError::NoXdp)
    }
}

#[cfg(feature = "xdp")]
mod imp {
    use super::limits::{LogLimit, RequestRate, Verdict};
    use super::policy::{self, LinkId, SocketFacts, XdpInterface};
    use super::*;
    use netgap_core::spec::{Mode, TransportOptions};
    use netgap_proto::dataproof::FlowKey;
    use netgap_proto::preload::{RelayReply, RelayRequest, RELAY_REQUEST_BYTES};
    use netgap_proto::relay::{self as frame, Inflow, Kind, Outflow};
    use netgap_shm::wait as shm_wait;
    use netgap_shm::{Consumer, Expect, Producer, Region, Role, Waits};
    use netgap_transport::xdp::{parse_addr, Xdp, XdpAddr};
    use netgap_transport::{Flow, FlowConfig, Receiver, Sender, Transport};
    use std::collections::{HashMap, VecDeque};
    use std::io;
    use std::net::IpAddr;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    /// The abstract socket the libraries reach.
    const SOCKET_NAME: &str = "netgap-relay";
    /// How long a client has to send its request.
    const REQUEST_WAIT: Duration = Duration::from_secs(5);
    /// How long a reservation waits for its connect.
    const CONNECT_WAIT: Duration = Duration::from_secs(15);
    /// How long a listen waits for the other relay's flow, and then for
    /// the other relay's `OPEN` naming its connection.
    const ACCEPT_WAIT: Duration = Duration::from_secs(10);
    /// How long a connect waits for the answer to its `OPEN` (the other
    /// relay answers at once from its receiving thread).
    const OPEN_WAIT: Duration = Duration::from_secs(3);
    /// How long a request waits for the link while another request opens
    /// or closes it. A connect's reply comes within this, an xdp connect
    /// (3 s at most) and `OPEN_WAIT`: the library waits 10 s for it.
    const STATE_WAIT: Duration = Duration::from_secs(4);
    /// A link with no connection for this long closes, releasing its
    /// flow on the port.
    const LINGER: Duration = Duration::from_secs(2);
    /// How often waiting threads look again (a broken connection, the
    /// linger, the program's doorbells).
    const TICK: Duration = Duration::from_millis(50);

    /// The keep-alive interval for a timeout.
    fn ping_every(timeout: Duration) -> Duration {
        timeout / 3
    }

    macro_rules! log {
        ($($t:tt)*) => {
            eprintln!("netgap relay: {}", format!($($t)*))
        };
    }

    /// The log lines a client's requests cause (refusals, drops, the
    /// links they open), held to a few a second per uid
    /// ([`LogLimit`]); what passes the limit is counted and said in one
    /// line. Lines of connections the other relay accepted are written
    /// as they come (each needed a request).
    struct Journal {
        limit: Mutex<LogLimit>,
        /// The lines the other relay's requests cause on a link (an
        /// `OPEN` no listen waits for), per link: the other relay's
        /// programs' requests make them.
        links: Mutex<LogLimit>,
    }

    impl Journal {
        fn new() -> Arc<Journal> {
            Arc::new(Journal {
                limit: Mutex::new(LogLimit::new("uid")),
                links: Mutex::new(LogLimit::new("link with flow")),
            })
        }

        /// Writes `line` (from a client of `uid`) if the uid's lines are
        /// within the limit. What a client wrote in it is printable ASCII
        /// (the request's decoder refuses anything else).
        fn client(&self, uid: u32, line: &str) {
            Self::write(&self.limit, uid, line);
        }

        /// Writes `line` (about the link with flow id `flow`) if the
        /// link's lines are within the limit.
        fn link(&self, flow: u16, line: &str) {
            Self::write(&self.links, u32::from(flow), line);
        }

        fn write(limit: &Mutex<LogLimit>, key: u32, line: &str) {
            let v = limit
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .line(key, Instant::now());
            if let Verdict::Write(dropped) = v {
                if let Some(d) = dropped {
                    log!("{d}");
                }
                log!("{line}");
            }
        }

        /// Says, about every second, the counts of lines not written
        /// whose uid may write again (a client that stopped).
        fn spawn_summaries(self: &Arc<Self>) {
            let j = Arc::downgrade(self);
            let spawned =
                std::thread::Builder::new()
                    .name("relay-log".into())
                    .spawn(move || loop {
                        std::thread::sleep(Duration::from_secs(1));
                        let Some(j) = j.upgrade() else { return };
                        for limit in [&j.limit, &j.links] {
                            let due = limit
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .due(Instant::now());
                            for d in due {
                                log!("{d}");
                            }
                        }
                    });
            // Without the thread, a count still comes out with the key's
            // next line.
            if let Err(e) = spawned {
                log!("no thread for the log's counts: {e}");
            }
        }
    }

    /// Connections per uid and in all.
    struct Counts {
        per_uid: HashMap<u32, u32>,
        total: u32,
    }

    /// One connection's place in the counts, given back on drop.
    struct Slot {
        counts: Arc<Mutex<Counts>>,
        uid: u32,
    }

    impl Drop for Slot {
        fn drop(&mut self) {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            c.total = c.total.saturating_sub(1);
            if let Some(n) = c.per_uid.get_mut(&self.uid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.per_uid.remove(&self.uid);
                }
            }
        }
    }

    fn errno_err(what: &str) -> io::Error {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }

    fn listen_socket() -> io::Result<OwnedFd> {
        // SAFETY: plain socket creation, checked and owned at once.
        let fd =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(errno_err("socket"));
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero bytes are a valid sockaddr_un.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in a.sun_path[1..].iter_mut().zip(SOCKET_NAME.bytes()) {
            *d = s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + SOCKET_NAME.len();
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const a).cast(),
                len as libc::socklen_t,
            )
        } != 0
        {
            return Err(errno_err("bind"));
        }
        // SAFETY: a plain listen on our socket.
        if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
            return Err(errno_err("listen"));
        }
        Ok(fd)
    }

    pub(super) fn run(args: &RelayArgs, setup: Setup) -> Result<(), RelayError> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(RelayError::NotRoot);
        }
        let iface = read_interface(&setup.interface).map_err(|why| RelayError::Interface {
            name: setup.interface.clone(),
            why,
        })?;
        let lfd = listen_socket().map_err(RelayError::Listen)?;
        if let Err(why) = crate::probe::spawn() {
            log!("{why}");
        }
        log!(
            "listening on @{SOCKET_NAME} for connections to {} over {} ({}/{}) (at most {} connections per uid, {} in all, {} requests a second per uid; timeout {} ms)",
            setup.served,
            iface.name,
            iface.ip,
            iface.prefix_len,
            args.max_per_uid,
            args.max_total,
            args.max_requests_per_uid,
            args.timeout_ms
        );
        let counts = Arc::new(Mutex::new(Counts {
            per_uid: HashMap::new(),
            total: 0,
        }));
        let journal = Journal::new();
        journal.spawn_summaries();
        let hub = Arc::new(Hub {
            links: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            pending: Mutex::new(HashMap::new()),
            timeout: Duration::from_millis(args.timeout_ms),
            max_links: args.max_links as usize,
            iface,
            served: setup.served,
            relay_key: setup.key,
            journal,
        });
        let mut rate = RequestRate::new(args.max_requests_per_uid);
        let refuser = Refuser::spawn();
        loop {
            // SAFETY: accept on our listening socket; the result is checked
            // and owned at once.
            let c = unsafe {
                libc::accept4(
                    lfd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if c < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    log!("accept: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            // SAFETY: a new descriptor nothing else owns.
            let client = unsafe { OwnedFd::from_raw_fd(c) };
            let Some(cred) = peer_cred(client.as_raw_fd()) else {
                // The kernel always has a Unix socket's peer's
                // credentials: this is not a client's doing.
                log!("a client without credentials: dropped");
                continue;
            };
            if !rate.admit(cred.uid, Instant::now()) {
                hub.journal.client(
                    cred.uid,
                    &format!(
                        "uid {} (pid {}): refused: more than {} requests a second (--max-requests-per-uid)",
                        cred.uid, cred.pid, args.max_requests_per_uid
                    ),
                );
                refuser.refuse(
                    client,
                    format!("more than {} requests a second", args.max_requests_per_uid),
                );
                continue;
            }
            let slot = {
                let mut n = counts.lock().unwrap_or_else(|e| e.into_inner());
                let mine = n.per_uid.get(&cred.uid).copied().unwrap_or(0);
                if mine >= args.max_per_uid || n.total >= args.max_total {
                    drop(n);
                    hub.journal.client(
                        cred.uid,
                        &format!(
                            "uid {} (pid {}): refused: connection limit ({} per uid, {} in all)",
                            cred.uid, cred.pid, args.max_per_uid, args.max_total
                        ),
                    );
                    refuser.refuse(client, "connection limit".into());
                    continue;
                }
                n.total += 1;
                *n.per_uid.entry(cred.uid).or_insert(0) += 1;
                Slot {
                    counts: Arc::clone(&counts),
                    uid: cred.uid,
                }
            };
            let hub = Arc::clone(&hub);
            let spawned = std::thread::Builder::new()
                .name("relay-conn".into())
                .spawn(move || serve(&hub, client, cred, slot));
            if let Err(e) = spawned {
                log!("no thread for a client: {e}");
            }
        }
    }

    /// How long the refusing thread waits for a refused client's request.
    const REFUSE_WAIT: Duration = Duration::from_millis(100);
    /// Refused clients waiting for the refusing thread.
    const REFUSALS_QUEUED: usize = 256;

    /// The refusals made in the accepting loop, before a client has a
    /// thread (past the requests a second, or the connection limits): one
    /// thread reads each client's request (waiting at most
    /// [`REFUSE_WAIT`]; its descriptors are closed) and only then replies
    /// and closes, since a Unix socket closed with a message unread resets
    /// its peer, which then never reads the reply. Past
    /// [`REFUSALS_QUEUED`] waiting, a client gets its reply at once, and
    /// may see its connection reset instead.
    struct Refuser {
        queue: Option<mpsc::SyncSender<(OwnedFd, String)>>,
    }

    impl Refuser {
        fn spawn() -> Refuser {
            let (tx, rx) = mpsc::sync_channel::<(OwnedFd, String)>(REFUSALS_QUEUED);
            let spawned = std::thread::Builder::new()
                .name("relay-refuse".into())
                .spawn(move || {
                    for (client, why) in rx {
                        // Whatever came (or nothing in time), the reply
                        // follows; the request is not looked at.
                        let _ = read_request(client.as_raw_fd(), REFUSE_WAIT);
                        reply(client.as_raw_fd(), &RelayReply::Refused(why));
                    }
                });
            match spawned {
                Ok(_) => Refuser { queue: Some(tx) },
                Err(e) => {
                    log!("no thread for refusals (each is replied at once): {e}");
                    Refuser { queue: None }
                }
            }
        }

        /// Refuses `client` for `why` (its line is the caller's).
        fn refuse(&self, client: OwnedFd, why: String) {
            let queued = match &self.queue {
                Some(q) => q.try_send((client, why)),
                None => Err(mpsc::TrySendError::Full((client, why))),
            };
            if let Err(mpsc::TrySendError::Full((client, why)))
            | Err(mpsc::TrySendError::Disconnected((client, why))) = queued
            {
                reply(client.as_raw_fd(), &RelayReply::Refused(why));
            }
        }
    }

    /// A client's credentials.
    #[derive(Clone, Copy)]
    struct Cred {
        pid: i32,
        uid: u32,
    }

    fn peer_cred(fd: RawFd) -> Option<Cred> {
        // SAFETY: all-zero bytes are a valid ucred.
        let mut c: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `c` is valid for writes of `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut c).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(Cred {
            pid: c.pid,
            uid: c.uid,
        })
    }

    fn reply(fd: RawFd, r: &RelayReply) {
        let b = r.encode();
        // SAFETY: `b` is valid for reads of its length.
        let _ = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
    }

    /// The request and its two descriptors (the region, the TCP socket).
    struct Request {
        req: RelayRequest,
        region: OwnedFd,
        tcp: OwnedFd,
    }

    /// Reads one request and the descriptors beside it, waiting at most
    /// `wait`; Ok(None): the client closed without one (a library checking
    /// that the relay runs, or giving up a reservation).
    fn read_request(
        fd: RawFd,
        wait: Duration,
    ) -> Result<Option<(RelayRequest, Vec<OwnedFd>)>, String> {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            return Err("no request in time".into());
        }
        let mut buf = [0u8; RELAY_REQUEST_BYTES + 1];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for a few descriptors, so that too many are seen (and
        // closed), not cut.
        let mut control = [0u8; 128];
        // SAFETY: all-zero bytes are a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len();
        // SAFETY: a complete msghdr over live buffers.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(format!("recvmsg: {}", io::Error::last_os_error()));
        }
        // Every descriptor received is owned (and so closed) whatever
        // follows.
        let mut fds: Vec<OwnedFd> = Vec::new();
        // SAFETY: walking the control buffer the kernel filled, with the
        // CMSG macros over `msg`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                        let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
            return Err("a request or its descriptors were cut".into());
        }
        let req =
            RelayRequest::decode(&buf[..n as usize]).map_err(|e| format!("bad request: {e}"))?;
        Ok(Some((req, fds)))
    }

    /// A request that must come with the region and the TCP socket.
    fn with_fds(req: RelayRequest, mut fds: Vec<OwnedFd>) -> Result<Request, String> {
        if fds.len() != 2 {
            return Err(format!(
                "{} descriptors with the request, want 2",
                fds.len()
            ));
        }
        let tcp = fds.pop().ok_or("no socket")?;
        let region = fds.pop().ok_or("no region")?;
        Ok(Request { req, region, tcp })
    }

    /// What this relay's link to one other host is doing; a host with no
    /// entry has no link, and the next listen or connect for it opens one.
    enum State {
        /// A request is opening the link (listening for the other relay's
        /// flow, or connecting to it): the others for that host wait for
        /// it.
        Opening,
        /// The link, until both its threads have ended (also while it
        /// closes: requests then wait for its entry to go).
        Up(Arc<Link>),
    }

    /// The links by the other host's TCP address: the peer address of
    /// the programs' connections, which both ends of a connection know
    /// before any link exists.
    type Links = HashMap<IpAddr, State>;

    /// What the relay holds of one program's connection: the ring, a
    /// duplicate of its TCP socket, and a duplicate of the client socket
    /// (to wake the program on this host; see `netgap_shm::wait::WAIT_BELL`).
    struct Ends {
        ring: FarEnd,
        tcp: OwnedFd,
        client: OwnedFd,
    }

    /// A listen waiting for the other relay's `OPEN` with its key.
    struct Pending {
        ends: Ends,
        give: mpsc::SyncSender<(Arc<Conn>, Arc<Link>)>,
    }

    /// The relay's links and the listens waiting for their connection,
    /// and what it was started for.
    struct Hub {
        links: Mutex<Links>,
        cv: Condvar,
        pending: Mutex<HashMap<[u8; frame::KEY_BYTES], Pending>>,
        timeout: Duration,
        max_links: usize,
        /// The interface of its flows (`--interface`).
        iface: XdpInterface,
        /// The hosts it serves (`--peers`).
        served: policy::Served,
        /// The relays' key (`--key`): every link's key derives from it.
        relay_key: netgap_proto::auth::Key,
        journal: Arc<Journal>,
    }

    impl Hub {
        fn lock(&self) -> MutexGuard<'_, Links> {
            self.links.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Sets the state of the link to `peer` (None: it has none).
        fn set(&self, peer: IpAddr, s: Option<State>) {
            let mut m = self.lock();
            match s {
                Some(s) => m.insert(peer, s),
                None => m.remove(&peer),
            };
            drop(m);
            self.cv.notify_all();
        }

        /// Marks the link to `peer`, which has none, as opening by the
        /// caller, if the relay has room for one more.
        fn claim(&self, m: &mut Links, peer: IpAddr) -> Result<(), String> {
            if m.len() >= self.max_links {
                return Err(format!(
                    "{} links to other hosts are open or opening, the most this relay holds (--max-links)",
                    m.len()
                ));
            }
            m.insert(peer, State::Opening);
            Ok(())
        }

        /// Waits for a change of state until `deadline`; None: time is up.
        fn wait<'a>(
            &self,
            g: MutexGuard<'a, Links>,
            deadline: Instant,
        ) -> Option<MutexGuard<'a, Links>> {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            Some(
                self.cv
                    .wait_timeout(g, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0,
            )
        }

        fn pending(&self) -> MutexGuard<'_, HashMap<[u8; frame::KEY_BYTES], Pending>> {
            self.pending.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Registers a listen's connection until the `OPEN` with its key.
        fn register(&self, key: [u8; frame::KEY_BYTES], p: Pending) -> Result<(), String> {
            let mut m = self.pending();
            if m.contains_key(&key) {
                return Err("a connection with the same key already waits".into());
            }
            m.insert(key, p);
            Ok(())
        }

        /// Gives up a listen's connection if no `OPEN` took it: its TCP
        /// connection is reset (the program waits on its ring otherwise).
        /// False: an `OPEN` took it first.
        fn abandon(&self, key: &[u8; frame::KEY_BYTES]) -> bool {
            let Some(p) = self.pending().remove(key) else {
                return false;
            };
            reset_tcp(p.ends.tcp.as_raw_fd());
            p.ends.ring.closing();
            true
        }
    }

    /// A connection relayed on the link, with the link.
    type Opened = (Arc<Conn>, Arc<Link>);

    /// Why a request failed, and whether the library already has its
    /// reply (then a refusal would only be noise on its doorbell socket).
    struct Failed {
        why: String,
        replied: bool,
    }

    fn before(why: String) -> Failed {
        Failed {
            why,
            replied: false,
        }
    }

    fn after(why: String) -> Failed {
        Failed { why, replied: true }
    }

    /// The client a request came from: its uid, and how its lines name
    /// it.
    struct Asker {
        uid: u32,
        who: String,
    }

    impl Asker {
        /// A line about this client's request, within its uid's share of
        /// the log.
        fn say(&self, hub: &Hub, what: &str) {
            hub.journal
                .client(self.uid, &format!("{}: {what}", self.who));
        }
    }

    fn serve(hub: &Arc<Hub>, client: OwnedFd, cred: Cred, slot: Slot) {
        let asker = Asker {
            uid: cred.uid,
            who: format!("uid {} (pid {})", cred.uid, cred.pid),
        };
        let fd = client.as_raw_fd();
        let refuse = |why: String| {
            asker.say(hub, &format!("refused: {why}"));
            reply(fd, &RelayReply::Refused(why));
        };
        let first = match read_request(fd, REQUEST_WAIT) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(why) => return refuse(why),
        };
        let r = match first {
            (RelayRequest::Reserve { key, .. }, fds) if fds.is_empty() => {
                // Every connection shares the link: a reservation only
                // says the relay runs and has room under the limits.
                reply(fd, &RelayReply::Ok("reserved".into()));
                // The connect follows once the listener answered the
                // hello (which it may take a while to read).
                match read_request(fd, CONNECT_WAIT) {
                    Ok(Some((req @ RelayRequest::Connect { key: k, .. }, fds))) if k == key => {
                        with_fds(req, fds)
                    }
                    Ok(Some(_)) => Err("after a reservation, anything but its connect".into()),
                    Ok(None) => return,
                    Err(why) => Err(why),
                }
            }
            (req @ (RelayRequest::Listen { .. } | RelayRequest::Connect { .. }), fds) => {
                with_fds(req, fds)
            }
            (RelayRequest::Reserve { .. }, _) => Err("descriptors with a reservation".into()),
        };
        let r = match r {
            Ok(r) => r,
            Err(why) => return refuse(why),
        };
        let opened = match &r.req {
            RelayRequest::Listen { .. } => listen(hub, r, &client, &asker),
            RelayRequest::Connect { .. } => connect(hub, r, &client, &asker),
            RelayRequest::Reserve { .. } => Err(before("a reservation names no flow".into())),
        };
        match opened {
            Ok((conn, link)) => pump(&conn, &link, &client, &asker.who),
            // The library already has its reply: a refusal now would only
            // be noise on its doorbell socket.
            Err(f) if f.replied => asker.say(hub, &format!("refused: {}", f.why)),
            Err(f) => refuse(f.why),
        }
        drop(slot);
    }

    fn ring_of(req: &RelayRequest) -> u32 {
        match req {
            RelayRequest::Listen { ring_bytes, .. }
            | RelayRequest::Reserve { ring_bytes, .. }
            | RelayRequest::Connect { ring_bytes, .. } => *ring_bytes,
        }
    }

    fn key_of(req: &RelayRequest) -> [u8; frame::KEY_BYTES] {
        match req {
            RelayRequest::Listen { key, .. }
            | RelayRequest::Reserve { key, .. }
            | RelayRequest::Connect { key, .. } => *key,
        }
    }

    fn flow_config(timeout: Duration) -> FlowConfig {
        FlowConfig {
            mode: Mode::Event,
            options: TransportOptions::default(),
            io_timeout: timeout,
        }
    }

    /// The program's ring and duplicates of its TCP socket and of the
    /// client socket, once the request passed the relay's rules
    /// ([`policy::check_socket`]: the asker's own connected socket and
    /// region, to a host it serves, not over the xdp interface); the TCP
    /// connection's two addresses.
    fn take_parts(
        hub: &Hub,
        r: &Request,
        client: &OwnedFd,
        uid: u32,
    ) -> Result<(Ends, IpAddr, IpAddr), String> {
        let facts = socket_facts(r)?;
        policy::check_socket(uid, &facts, &hub.served, &hub.iface)?;
        let ring = FarEnd::map(r.region.as_raw_fd(), ring_of(&r.req) as usize)?;
        let tcp = r
            .tcp
            .try_clone()
            .map_err(|e| format!("keeping the TCP socket: {e}"))?;
        let client = client
            .try_clone()
            .map_err(|e| format!("keeping the client socket: {e}"))?;
        Ok((Ends { ring, tcp, client }, facts.local, facts.peer))
    }

    /// The accepting side: names this relay's end of the link (opening it
    /// if it is down) and waits for the other relay's `OPEN` with the
    /// connection's key.
    fn listen(
        hub: &Arc<Hub>,
        r: Request,
        client_sock: &OwnedFd,
        asker: &Asker,
    ) -> Result<Opened, Failed> {
        let key = key_of(&r.req);
        let (ends, tcp_local, tcp_peer) =
            take_parts(hub, &r, client_sock, asker.uid).map_err(before)?;
        let client = client_sock.as_raw_fd();
        let (give, take) = mpsc::sync_channel(1);
        let pending = Pending { ends, give };
        let deadline = Instant::now() + STATE_WAIT;
        let mut st = hub.lock();
        loop {
            match st.get(&tcp_peer) {
                Some(State::Up(link)) if !link.closing() => {
                    let name = link.local_name.clone();
                    link.touch();
                    drop(st);
                    hub.register(key, pending).map_err(before)?;
                    reply(client, &RelayReply::Ok(name));
                    break;
                }
                None => {
                    hub.claim(&mut st, tcp_peer).map_err(before)?;
                    drop(st);
                    let opened =
                        open_listening(hub, &r.req, pending, (tcp_local, tcp_peer), client, asker);
                    if let Err(f) = opened {
                        hub.set(tcp_peer, None);
                        return Err(f);
                    }
                    break;
                }
                Some(_) => {
                    st = hub
                        .wait(st, deadline)
                        .ok_or_else(|| before("the link did not come up in time".into()))?;
                }
            }
        }
        match take.recv_timeout(ACCEPT_WAIT) {
            Ok(o) => Ok(o),
            Err(mpsc::RecvTimeoutError::Timeout) if hub.abandon(&key) => Err(after(
                "no OPEN for the connection from the other relay in time".into(),
            )),
            // An OPEN took it meanwhile: its connection is on the way.
            Err(mpsc::RecvTimeoutError::Timeout) => take
                .recv_timeout(Duration::from_secs(1))
                .map_err(|_| after("the link closed as the connection opened".into())),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(after("the link closed before the connection opened".into()))
            }
        }
    }

    /// Opens the link as its accepting side: an xdp listen on the relay's
    /// interface, the reply, the other relay's flow keyed from the relay
    /// key ([`LinkId::flow_key`]).
    fn open_listening(
        hub: &Arc<Hub>,
        req: &RelayRequest,
        pending: Pending,
        (tcp_local, tcp_peer): (IpAddr, IpAddr),
        client: RawFd,
        asker: &Asker,
    ) -> Result<(), Failed> {
        let key = key_of(req);
        let mut l = Xdp
            .listen(&flow_config(hub.timeout), IpAddr::V4(hub.iface.ip))
            .map_err(|e| before(format!("xdp listen: {e}")))?;
        let name = l.addr();
        let own = parse_addr(&name).map_err(before)?;
        let link_key = LinkId::of_request(req, &own, tcp_local, tcp_peer)
            .map_err(before)?
            .flow_key(&hub.relay_key);
        hub.register(key, pending).map_err(before)?;
        asker.say(
            hub,
            &format!("no link: listening for the other relay's flow at {name} (a connection from {tcp_peer})"),
        );
        reply(client, &RelayReply::Ok(name.clone()));
        let fail = |why: String| {
            hub.abandon(&key);
            after(why)
        };
        let mut flow = l
            .accept(ACCEPT_WAIT)
            .map_err(|e| fail(format!("xdp accept: {e}")))?;
        drop(l);
        flow.bind_session(&FlowKey::from_bytes(link_key))
            .map_err(|e| fail(format!("keying the link: {e}")))?;
        Link::start(hub, flow, name, (0, own.flow), tcp_peer).map_err(fail)?;
        Ok(())
    }

    /// The connecting side: opens the connection on the link to the
    /// target's host (opening the link if it is down), once the target
    /// passed the relay's rules ([`policy::check_target`]: on the
    /// interface's subnet, at the neighbour table's MAC).
    fn connect(
        hub: &Arc<Hub>,
        r: Request,
        client_sock: &OwnedFd,
        asker: &Asker,
    ) -> Result<Opened, Failed> {
        let RelayRequest::Connect { key, target, .. } = &r.req else {
            return Err(before("not a connect".into()));
        };
        let t = parse_addr(target).map_err(|e| before(format!("target {target}: {e}")))?;
        let (ends, tcp_local, tcp_peer) =
            take_parts(hub, &r, client_sock, asker.uid).map_err(before)?;
        let client = client_sock.as_raw_fd();
        if t.ip == tcp_peer {
            return Err(before(format!(
                "target {target} is the TCP connection's own peer address: the flow would take that interface's frames"
            )));
        }
        policy::check_target(&t, &hub.iface, neighbour(t.ip, &hub.iface.name)).map_err(before)?;
        let own = own_end(&hub.iface, t.flow);
        let link_id = LinkId::of_request(&r.req, &own, tcp_local, tcp_peer).map_err(before)?;
        let mut parts = Some(ends);
        let deadline = Instant::now() + STATE_WAIT;
        let late = || before("the link did not come up in time".into());
        loop {
            let mut st = hub.lock();
            let up = loop {
                match st.get(&tcp_peer) {
                    Some(State::Up(link)) if !link.closing() => break Some(Arc::clone(link)),
                    None => {
                        hub.claim(&mut st, tcp_peer).map_err(before)?;
                        break None;
                    }
                    Some(_) => st = hub.wait(st, deadline).ok_or_else(late)?,
                }
            };
            drop(st);
            let link = match up {
                Some(l) => l,
                None => match open_connecting(hub, t, target, &link_id, tcp_peer, asker) {
                    Ok(l) => l,
                    Err(why) => {
                        hub.set(tcp_peer, None);
                        return Err(before(why));
                    }
                },
            };
            if link.peer_ip != t.ip || link.flow_id != t.flow {
                // The other relay listens on a new flow (or another
                // interface): it lost this
                // link (restarted, or timed it out). An idle link is
                // closed at once; one still carrying connections is
                // left to its timeout rather than broken on one
                // request's word.
                if !link.idle() {
                    return Err(before(format!(
                        "the other relay listens at {target}, not on this host's link to it ({}): retry once that link times out",
                        link.peer_name
                    )));
                }
                link.shut("the other relay listens anew: the link is stale");
            } else {
                match link.open_conn(*key, &mut parts) {
                    Ok(conn) => {
                        reply(client, &RelayReply::Ok("-".into()));
                        return Ok((conn, link));
                    }
                    Err(None) => {}
                    Err(Some(why)) => return Err(before(why)),
                }
            }
            if Instant::now() >= deadline {
                return Err(late());
            }
        }
    }

    /// Opens the link as its connecting side, keyed from the relay key
    /// ([`LinkId::flow_key`]).
    fn open_connecting(
        hub: &Arc<Hub>,
        t: XdpAddr,
        target: &str,
        link_id: &LinkId,
        tcp_peer: IpAddr,
        asker: &Asker,
    ) -> Result<Arc<Link>, String> {
        let mut flow = Xdp
            .connect(&flow_config(hub.timeout), target)
            .map_err(|e| format!("xdp connect to {target}: {e}"))?;
        flow.bind_session(&FlowKey::from_bytes(link_id.flow_key(&hub.relay_key)))
            .map_err(|e| format!("keying the link: {e}"))?;
        let name = own_end(&hub.iface, t.flow).to_string();
        asker.say(hub, &format!("no link: connected to {target}"));
        Link::start(hub, flow, name, (frame::CONNECTOR_BIT, t.flow), tcp_peer)
    }

    /// This host's end of a link whose flow id is `flow`: the relay's
    /// interface's address and MAC.
    fn own_end(iface: &XdpInterface, flow: u16) -> XdpAddr {
        XdpAddr {
            ip: IpAddr::V4(iface.ip),
            mac: iface.mac,
            flow,
        }
    }

    /// Reads the interface the relay was started for: it must exist, not
    /// be loopback, and have a MAC and exactly one IPv4 address.
    fn read_interface(name: &str) -> Result<XdpInterface, String> {
        use nix::net::if_::InterfaceFlags;
        let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
            .map_err(|e| format!("getifaddrs: {e}"))?
            .filter(|a| a.interface_name == name)
            .collect();
        if addrs.is_empty() {
            return Err("no such interface in this network namespace".into());
        }
        if addrs
            .iter()
            .any(|a| a.flags.contains(InterfaceFlags::IFF_LOOPBACK))
        {
            return Err("a loopback interface carries no xdp flow to another host".into());
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
            return Err(format!(
                "has {} IPv4 addresses; the relay's flows need exactly one",
                v4.len()
            ));
        };
        let mac = addrs
            .iter()
            .find_map(|a| a.address.as_ref()?.as_link_addr()?.addr())
            .filter(|m| *m != [0; 6])
            .ok_or("has no MAC address")?;
        Ok(XdpInterface {
            name: name.to_string(),
            ip: *ip,
            prefix_len: *prefix_len,
            mac,
        })
    }

    /// Most bytes of `/proc/net/arp` read (some 10 000 entries).
    const MAX_ARP_BYTES: u64 = 1 << 20;

    /// The MAC the kernel's neighbour table holds for `ip` on `dev`, if
    /// it holds a complete entry.
    fn neighbour(ip: IpAddr, dev: &str) -> Option<[u8; 6]> {
        use std::io::Read;
        let IpAddr::V4(ip) = ip else { return None };
        let mut text = String::new();
        let f = std::fs::File::open("/proc/net/arp").ok()?;
        f.take(MAX_ARP_BYTES).read_to_string(&mut text).ok()?;
        policy::neighbour_mac(&text, ip, dev)
    }

    /// What a link's writing thread is given.
    enum Out {
        /// A whole frame to send.
        Frame(Vec<u8>),
        /// Say `LINK_CLOSE` and stop.
        Close,
        /// A connection's thread could not send on the flow: the link is
        /// broken.
        Broken(String),
    }

    /// How a connection's frame leaves.
    #[derive(Clone, Copy)]
    enum Via {
        /// On this thread when nothing waits in the writing thread's
        /// queue, waiting for the flow's window if need be: one thread's
        /// wake-up fewer per message. A connection's own threads.
        Now,
        /// Through the writing thread's queue, never waiting: the link's
        /// receiving thread, which must not wait on the flow (the other
        /// relay's window opens only as this end reads).
        Queue,
    }

    /// The link's way out: every frame in order on the flow's one sending
    /// half, sent by the thread that has it or queued for the writing
    /// thread.
    struct Outbox {
        queue: mpsc::Sender<Out>,
        /// Frames in `queue` not yet sent: while any waits, a frame sent
        /// at once would overtake it (and a connection's `DATA` its own
        /// earlier frames).
        queued: AtomicUsize,
        /// The flow's sending half while the writing thread runs (it takes
        /// it when it ends, releasing the flow).
        tx: Mutex<Option<Box<dyn Sender>>>,
        frames_out: AtomicU64,
    }

    impl Outbox {
        fn new(queue: mpsc::Sender<Out>, tx: Option<Box<dyn Sender>>) -> Outbox {
            Outbox {
                queue,
                queued: AtomicUsize::new(0),
                tx: Mutex::new(tx),
                frames_out: AtomicU64::new(0),
            }
        }

        fn sender(&self) -> MutexGuard<'_, Option<Box<dyn Sender>>> {
            self.tx.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Sends frame `f` on the flow, whose sending half `tx` is locked.
        fn put(&self, tx: &mut Option<Box<dyn Sender>>, f: &[u8]) -> Result<(), String> {
            tx.as_mut()
                .ok_or("the link closed")?
                .send_all(f)
                .map_err(|e| format!("sending to the other relay: {e}"))?;
            self.frames_out.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        /// Frame `f` leaves `via` that way (copied only if queued).
        fn send(&self, f: &[u8], via: Via) -> Result<(), String> {
            if let Via::Now = via {
                let mut tx = self.sender();
                // Checked under the lock the writing thread sends under,
                // and counted down only once a queued frame is sent.
                if self.queued.load(Ordering::SeqCst) == 0 {
                    return self.put(&mut tx, f).inspect_err(|e| {
                        let _ = self.queue.send(Out::Broken(e.clone()));
                    });
                }
            }
            self.queued.fetch_add(1, Ordering::SeqCst);
            self.queue.send(Out::Frame(f.to_vec())).map_err(|_| {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                "the link closed".to_string()
            })
        }

        /// The writing thread's send of a frame from its queue.
        fn send_queued(&self, f: &[u8]) -> Result<(), String> {
            let mut tx = self.sender();
            self.put(&mut tx, f)?;
            self.queued.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }

        /// The writing thread's own frame (a keep-alive, the close).
        fn send_control(&self, kind: Kind) -> Result<(), String> {
            self.put(&mut self.sender(), &frame::frame(kind, 0, &[]))
        }

        /// Tells the writing thread to say `LINK_CLOSE` and stop.
        fn close(&self) {
            // A closed link's writer is gone: nothing more to say.
            let _ = self.queue.send(Out::Close);
        }
    }

    /// The link's connections, and since when it has none.
    struct Conns {
        map: HashMap<u32, Arc<Conn>>,
        idle_since: Instant,
    }

    /// One xdp flow to the other host's relay, carrying every relayed
    /// connection between the two hosts.
    struct Link {
        out: Arc<Outbox>,
        /// This relay's end, `IP/MAC/FLOW`: the target a listen names.
        local_name: String,
        /// The other relay's end, from its `LINK_HELLO`.
        peer_name: String,
        peer_ip: IpAddr,
        /// The TCP peer address of the connection that opened the link:
        /// the other host as its programs' connections come from it. A
        /// listen for a connection from any other address is not this
        /// link's.
        peer_tcp_ip: IpAddr,
        /// The listening end's flow id: both ends name it.
        flow_id: u16,
        /// The id bit of the connections this end opens.
        my_bit: u32,
        next_id: AtomicU32,
        conns: Mutex<Conns>,
        /// No new connection: the link is closing or broken.
        closing: AtomicBool,
        shut_once: AtomicBool,
        why: Mutex<Option<String>>,
        live_threads: AtomicU32,
        t0: Instant,
        conns_total: AtomicU64,
        frames_in: AtomicU64,
        unknown_id_frames: AtomicU64,
    }

    impl Link {
        /// A link just up, with no connection yet, its two threads about
        /// to start.
        fn new(
            out: Arc<Outbox>,
            local_name: String,
            peer_name: String,
            (peer_ip, peer_tcp_ip): (IpAddr, IpAddr),
            flow_id: u16,
            my_bit: u32,
        ) -> Link {
            Link {
                out,
                local_name,
                peer_name,
                peer_ip,
                peer_tcp_ip,
                flow_id,
                my_bit,
                next_id: AtomicU32::new(1),
                conns: Mutex::new(Conns {
                    map: HashMap::new(),
                    idle_since: Instant::now(),
                }),
                closing: AtomicBool::new(false),
                shut_once: AtomicBool::new(false),
                why: Mutex::new(None),
                live_threads: AtomicU32::new(2),
                t0: Instant::now(),
                conns_total: AtomicU64::new(0),
                frames_in: AtomicU64::new(0),
                unknown_id_frames: AtomicU64::new(0),
            }
        }

        /// Says hello both ways on a keyed flow, then runs the link's
        /// writing and receiving threads; the hub's state is `Up` with it.
        fn start(
            hub: &Arc<Hub>,
            flow: Box<dyn Flow>,
            local_name: String,
            (my_bit, flow_id): (u32, u16),
            peer_tcp_ip: IpAddr,
        ) -> Result<Arc<Link>, String> {
            let (mut tx, mut rx) = flow.into_halves();
            tx.send_all(&frame::frame(Kind::LinkHello, 0, local_name.as_bytes()))
                .map_err(|e| format!("the link's hello: {e}"))?;
            let mut h = [0u8; frame::HEADER_BYTES];
            rx.recv_exact(&mut h)
                .map_err(|e| format!("the other relay's hello: {e}"))?;
            let hd = frame::decode(&h).map_err(|e| format!("the other relay's hello: {e}"))?;
            if hd.kind != Kind::LinkHello {
                return Err(format!(
                    "the other relay began with {:?}, not its hello",
                    hd.kind
                ));
            }
            let mut name = vec![0u8; hd.len];
            rx.recv_exact(&mut name)
                .map_err(|e| format!("the other relay's hello: {e}"))?;
            let peer_name = String::from_utf8(name)
                .ok()
                .filter(|n| netgap_proto::preload::valid_target(n))
                .ok_or("the other relay's hello names no valid address")?;
            let peer = parse_addr(&peer_name)
                .map_err(|e| format!("the other relay's hello: {peer_name}: {e}"))?;
            let (out, out_rx) = mpsc::channel();
            let link = Arc::new(Link::new(
                Arc::new(Outbox::new(out, Some(tx))),
                local_name,
                peer_name,
                (peer.ip, peer_tcp_ip),
                flow_id,
                my_bit,
            ));
            hub.set(peer_tcp_ip, Some(State::Up(Arc::clone(&link))));
            log!(
                "link up: {} {} (this end {})",
                if my_bit == 0 {
                    "accepted from"
                } else {
                    "connected to"
                },
                link.peer_name,
                link.local_name
            );
            let ping = ping_every(hub.timeout);
            let (l, h) = (Arc::clone(&link), Arc::clone(hub));
            let w = std::thread::Builder::new()
                .name("relay-link-out".into())
                .spawn(move || {
                    if let Err(e) = writer(&l, &out_rx, ping) {
                        l.shut(&e);
                    } else {
                        l.shut("closed");
                    }
                    drop(out_rx);
                    // The flow's sending half goes with the thread: later
                    // sends fail.
                    drop(l.out.sender().take());
                    l.thread_done(&h);
                });
            if let Err(e) = w {
                link.shut(&format!("no thread for the link: {e}"));
                link.thread_done(hub);
            }
            let (l, h) = (Arc::clone(&link), Arc::clone(hub));
            let r = std::thread::Builder::new()
                .name("relay-link-in".into())
                .spawn(move || {
                    let why = match reader(&l, &h, &mut *rx) {
                        Ok(()) => "closed by the other relay".to_string(),
                        Err(e) => e,
                    };
                    l.shut(&why);
                    drop(rx);
                    l.thread_done(&h);
                });
            if let Err(e) = r {
                link.shut(&format!("no thread for the link: {e}"));
                link.thread_done(hub);
            }
            Ok(link)
        }

        fn closing(&self) -> bool {
            self.closing.load(Ordering::SeqCst)
        }

        fn lock(&self) -> MutexGuard<'_, Conns> {
            self.conns.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// A connection is about to come: the linger starts again.
        fn touch(&self) {
            self.lock().idle_since = Instant::now();
        }

        fn idle(&self) -> bool {
            self.lock().map.is_empty()
        }

        fn find(&self, id: u32) -> Option<Arc<Conn>> {
            let c = self.lock().map.get(&id).cloned();
            if c.is_none() {
                self.unknown_id_frames.fetch_add(1, Ordering::Relaxed);
            }
            c
        }

        fn unregister(&self, id: u32) {
            let mut c = self.lock();
            if c.map.remove(&id).is_some() && c.map.is_empty() {
                c.idle_since = Instant::now();
            }
        }

        /// Queues a frame of the link's own (never waits).
        fn push(&self, kind: Kind, id: u32, payload: &[u8]) {
            // A closed link's writer is gone: nothing more to say.
            let _ = self.out.send(&frame::frame(kind, id, payload), Via::Queue);
        }

        /// Whether the link had no connection for the linger: then it
        /// closes (no new connection on it from now).
        fn linger_over(&self) -> bool {
            let c = self.lock();
            if c.map.is_empty() && c.idle_since.elapsed() >= LINGER {
                self.closing.store(true, Ordering::SeqCst);
                true
            } else {
                false
            }
        }

        /// Opens a connection on the link: an id of this end, `OPEN` with
        /// the key, then the other relay's answer. Err(None): the link is
        /// closing (wait for the next); Err(Some): refused or broken.
        fn open_conn(
            self: &Arc<Self>,
            key: [u8; frame::KEY_BYTES],
            parts: &mut Option<Ends>,
        ) -> Result<Arc<Conn>, Option<String>> {
            let conn = {
                let mut c = self.lock();
                if self.closing() {
                    return Err(None);
                }
                let Some(ends) = parts.take() else {
                    return Err(Some("the connection is gone".into()));
                };
                let id = loop {
                    let n = self.next_id.fetch_add(1, Ordering::Relaxed) & !frame::CONNECTOR_BIT;
                    let id = n | self.my_bit;
                    if n != 0 && !c.map.contains_key(&id) {
                        break id;
                    }
                };
                let conn = Arc::new(Conn::new(id, ends, Arc::clone(&self.out), false));
                c.map.insert(id, Arc::clone(&conn));
                self.conns_total.fetch_add(1, Ordering::Relaxed);
                self.push(Kind::Open, id, &key);
                conn
            };
            match conn.wait_open(OPEN_WAIT) {
                Ok(()) => Ok(conn),
                Err(why) => {
                    self.unregister(conn.id);
                    // A late OPEN_OK would leave the other relay's side
                    // waiting for an end that never comes: RESET it.
                    conn.reset(true);
                    Err(Some(why))
                }
            }
        }

        /// The other relay's `OPEN`: the listen waiting with that key gets
        /// its connection, or the other relay hears `OPEN_REFUSED`.
        fn take_open(
            self: &Arc<Self>,
            hub: &Hub,
            id: u32,
            key: [u8; frame::KEY_BYTES],
        ) -> Result<(), String> {
            if id & frame::CONNECTOR_BIT == self.my_bit {
                return Err(format!("an OPEN with an id of this end ({id:#x})"));
            }
            let Some(p) = hub.pending().remove(&key) else {
                hub.journal.link(
                    self.flow_id,
                    &format!(
                        "link to {}: an OPEN ({id:#x}) with a key no connection here waits with: refused",
                        self.peer_name
                    ),
                );
                self.push(Kind::OpenRefused, id, &[]);
                return Ok(());
            };
            let mut c = self.lock();
            if c.map.contains_key(&id) || self.closing() {
                drop(c);
                reset_tcp(p.ends.tcp.as_raw_fd());
                p.ends.ring.closing();
                if self.closing() {
                    self.push(Kind::OpenRefused, id, &[]);
                    return Ok(());
                }
                return Err(format!("an OPEN with an id in use ({id:#x})"));
            }
            let conn = Arc::new(Conn::new(id, p.ends, Arc::clone(&self.out), true));
            c.map.insert(id, Arc::clone(&conn));
            self.conns_total.fetch_add(1, Ordering::Relaxed);
            drop(c);
            self.push(Kind::OpenOk, id, &[]);
            if p.give.send((Arc::clone(&conn), Arc::clone(self))).is_err() {
                self.unregister(id);
                conn.reset(true);
            }
            Ok(())
        }

        /// Stops the link (once): no new connection, every connection on
        /// it reset, `LINK_CLOSE` to the other relay.
        fn shut(&self, why: &str) {
            let conns: Vec<Arc<Conn>> = {
                let mut c = self.lock();
                self.closing.store(true, Ordering::SeqCst);
                if self.shut_once.swap(true, Ordering::SeqCst) {
                    return;
                }
                self.why
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| why.to_string());
                c.map.drain().map(|(_, v)| v).collect()
            };
            if !conns.is_empty() {
                log!(
                    "link to {}: {why}: resetting its {} connections",
                    self.peer_name,
                    conns.len()
                );
            }
            for c in conns {
                c.reset(false);
            }
            self.out.close();
        }

        /// One of the link's two threads ended; the last one (the flow is
        /// released by now) puts the hub down.
        fn thread_done(self: &Arc<Self>, hub: &Hub) {
            if self.live_threads.fetch_sub(1, Ordering::SeqCst) != 1 {
                return;
            }
            {
                let mut st = hub.lock();
                if matches!(st.get(&self.peer_tcp_ip), Some(State::Up(l)) if Arc::ptr_eq(l, self)) {
                    st.remove(&self.peer_tcp_ip);
                }
            }
            hub.cv.notify_all();
            let why = self
                .why
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default();
            log!(
                "link to {} closed after {} ms ({why}): connections={} frames_in={} frames_out={} unknown_id_frames={}",
                self.peer_name,
                self.t0.elapsed().as_millis(),
                self.conns_total.load(Ordering::Relaxed),
                self.frames_in.load(Ordering::Relaxed),
                self.out.frames_out.load(Ordering::Relaxed),
                self.unknown_id_frames.load(Ordering::Relaxed),
            );
        }
    }

    /// The link's writing thread: the frames queued for it in order, a
    /// keep-alive when the link is idle, the close after the linger.
    fn writer(link: &Link, rx: &mpsc::Receiver<Out>, ping: Duration) -> Result<(), String> {
        let out = &link.out;
        let mut last_sent = Instant::now();
        let mut frames_seen = 0;
        loop {
            match rx.recv_timeout(TICK) {
                Ok(Out::Frame(f)) => {
                    out.send_queued(&f)?;
                    last_sent = Instant::now();
                    continue;
                }
                Ok(Out::Broken(e)) => return Err(e),
                Ok(Out::Close) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = out.send_control(Kind::LinkClose);
                    return Ok(());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if link.linger_over() {
                link.why
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| format!("no connection for {} ms", LINGER.as_millis()));
                out.send_control(Kind::LinkClose)?;
                return Ok(());
            }
            // What the connections' threads sent themselves keeps the
            // link alive too.
            let frames = out.frames_out.load(Ordering::Relaxed);
            if frames != frames_seen {
                frames_seen = frames;
                last_sent = Instant::now();
            }
            if last_sent.elapsed() >= ping {
                out.send_control(Kind::Ping)?;
                last_sent = Instant::now();
                frames_seen = out.frames_out.load(Ordering::Relaxed);
            }
        }
    }

    /// The link's receiving thread: every frame to its connection, never
    /// waiting on a program (connections queue within their credit).
    /// Ok: the other relay closed the link; Err: it broke.
    fn reader(link: &Arc<Link>, hub: &Hub, rx: &mut dyn Receiver) -> Result<(), String> {
        let recv = |rx: &mut dyn Receiver, buf: &mut [u8]| {
            rx.recv_exact(buf)
                .map_err(|e| format!("the other relay: {e}"))
        };
        let mut h = [0u8; frame::HEADER_BYTES];
        // One buffer for every DATA payload (a frame's is at most a chunk):
        // what the program's ring takes is copied once, from here.
        let mut payload = vec![0u8; frame::CHUNK_BYTES];
        loop {
            recv(rx, &mut h)?;
            let hd =
                frame::decode(&h).map_err(|e| format!("a bad frame from the other relay: {e}"))?;
            link.frames_in.fetch_add(1, Ordering::Relaxed);
            let fault = |e: String| format!("connection {:#x}: {e}", hd.id);
            match hd.kind {
                Kind::Data => {
                    let v = payload
                        .get_mut(..hd.len)
                        .ok_or_else(|| fault("DATA longer than a chunk".into()))?;
                    recv(rx, v)?;
                    if let Some(c) = link.find(hd.id) {
                        match c.arrive(v) {
                            Ok(Some(n)) => {
                                // A closed link's writer is gone; the
                                // reader ends with the link anyway.
                                let _ = c.push(Kind::Credit, &n.to_le_bytes(), Via::Queue);
                            }
                            Ok(None) => {}
                            Err(ArriveError::Credit(e)) => return Err(fault(e.to_string())),
                            Err(ArriveError::Corrupt) => {
                                // The program broke its ring: its
                                // connection is reset, not the link.
                                c.reset(true);
                            }
                            Err(ArriveError::Closed) => {}
                        }
                    }
                }
                Kind::Bell => {
                    if let Some(c) = link.find(hd.id) {
                        c.ring_tcp();
                    }
                }
                Kind::End => {
                    if let Some(c) = link.find(hd.id) {
                        c.end();
                    }
                }
                Kind::Credit => {
                    let mut b = [0u8; 4];
                    recv(rx, &mut b)?;
                    let n = frame::credit_of(b).map_err(|e| fault(e.to_string()))?;
                    if let Some(c) = link.find(hd.id) {
                        c.grant(n).map_err(|e| fault(e.to_string()))?;
                    }
                }
                Kind::Open => {
                    let mut key = [0u8; frame::KEY_BYTES];
                    recv(rx, &mut key)?;
                    link.take_open(hub, hd.id, key)?;
                }
                Kind::OpenOk | Kind::OpenRefused => {
                    if hd.id & frame::CONNECTOR_BIT != link.my_bit {
                        return Err(fault("an answer to an OPEN this end did not send".into()));
                    }
                    if let Some(c) = link.find(hd.id) {
                        c.opened(hd.kind == Kind::OpenOk).map_err(fault)?;
                    }
                }
                Kind::Reset => {
                    if let Some(c) = link.find(hd.id) {
                        c.reset(false);
                    }
                }
                Kind::Ping => {}
                Kind::LinkHello => return Err("a second hello from the other relay".into()),
                Kind::LinkClose => return Ok(()),
            }
        }
    }

    /// Bytes from the other relay waiting for the program's ring.
    struct Inbox {
        chunks: VecDeque<Vec<u8>>,
        flow: Inflow,
        end: bool,
        /// The connection's receiving thread is putting a chunk it took
        /// into the ring: the link's reader must queue, not write.
        writing: bool,
    }

    /// Why a `DATA` frame could not be taken.
    enum ArriveError {
        /// Past the connection's credit: the other relay broke the
        /// protocol, and the link breaks.
        Credit(frame::CreditError),
        /// The program's ring is corrupt: its connection is reset.
        Corrupt,
        /// The link closed meanwhile.
        Closed,
    }

    /// Where an opened connection stands.
    #[derive(Clone, PartialEq, Eq)]
    enum Opening {
        Waiting,
        Open,
        Refused,
    }

    /// The sending side: credit, and the answer to this end's `OPEN`.
    struct SendSide {
        flow: Outflow,
        open: Opening,
    }

    /// One relayed connection on the link.
    struct Conn {
        id: u32,
        ring: FarEnd,
        tcp: OwnedFd,
        /// The client socket: a byte on it wakes the program where it
        /// waits in an epoll that watches it.
        client: OwnedFd,
        out: Arc<Outbox>,
        inbox: Mutex<Inbox>,
        inbox_cv: Condvar,
        send: Mutex<SendSide>,
        send_cv: Condvar,
        /// The connection broke: both threads stop.
        broken: AtomicBool,
        /// The program closed its last descriptor of the connection (or
        /// died): what still arrives for it is dropped, as the kernel
        /// drops data for a closed socket.
        program_gone: AtomicBool,
        discarded_bytes: AtomicU64,
        relayed_out_bytes: AtomicU64,
        relayed_in_bytes: AtomicU64,
        bells_asked: AtomicU64,
        bells_rung: AtomicU64,
        /// Wake-ups sent on the client socket.
        bells_here: AtomicU64,
    }

    impl Conn {
        fn new(id: u32, ends: Ends, out: Arc<Outbox>, open: bool) -> Conn {
            let Ends { ring, tcp, client } = ends;
            Conn {
                id,
                ring,
                tcp,
                client,
                out,
                inbox: Mutex::new(Inbox {
                    chunks: VecDeque::new(),
                    flow: Inflow::default(),
                    end: false,
                    writing: false,
                }),
                inbox_cv: Condvar::new(),
                send: Mutex::new(SendSide {
                    flow: Outflow::default(),
                    open: if open {
                        Opening::Open
                    } else {
                        Opening::Waiting
                    },
                }),
                send_cv: Condvar::new(),
                broken: AtomicBool::new(false),
                program_gone: AtomicBool::new(false),
                discarded_bytes: AtomicU64::new(0),
                relayed_out_bytes: AtomicU64::new(0),
                relayed_in_bytes: AtomicU64::new(0),
                bells_asked: AtomicU64::new(0),
                bells_rung: AtomicU64::new(0),
                bells_here: AtomicU64::new(0),
            }
        }

        fn inbox(&self) -> MutexGuard<'_, Inbox> {
            self.inbox.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn sending(&self) -> MutexGuard<'_, SendSide> {
            self.send.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn push(&self, kind: Kind, payload: &[u8], via: Via) -> Result<(), String> {
            self.out.send(&frame::frame(kind, self.id, payload), via)
        }

        fn broken(&self) -> bool {
            self.broken.load(Ordering::SeqCst)
        }

        /// `DATA` from the other relay, within the credit it had. With
        /// nothing queued before it, it goes straight into the program's
        /// ring as far as the ring has room (the ring never blocks, so the
        /// link's reader still never waits on a program), sparing a
        /// thread's wake-up per message; the rest is queued for the
        /// connection's receiving thread. Err: past the credit; Ok(Some):
        /// credit to return.
        fn arrive(&self, v: &[u8]) -> Result<Option<u32>, ArriveError> {
            let mut i = self.inbox();
            i.flow.arrive(v.len() as u32).map_err(ArriveError::Credit)?;
            let mut put = 0;
            let mut back = None;
            if i.chunks.is_empty() && !i.writing && !self.broken() {
                if self.program_gone.load(Ordering::SeqCst) {
                    // Counted as relayed and discarded, as `put_all` does.
                    self.discarded_bytes
                        .fetch_add(v.len() as u64, Ordering::Relaxed);
                    self.relayed_in_bytes
                        .fetch_add(v.len() as u64, Ordering::Relaxed);
                    put = v.len();
                } else {
                    let m = self.ring.write(v).map_err(|_| ArriveError::Corrupt)?;
                    self.wake(&m, Via::Queue).map_err(|_| ArriveError::Closed)?;
                    self.relayed_in_bytes
                        .fetch_add(m.bytes as u64, Ordering::Relaxed);
                    put = m.bytes;
                }
                back = i.flow.moved(put as u32);
            }
            if put < v.len() {
                i.chunks.push_back(v[put..].to_vec());
                self.inbox_cv.notify_one();
            }
            Ok(back)
        }

        /// The other relay's `END`: after what is queued, the end.
        fn end(&self) {
            self.inbox().end = true;
            self.inbox_cv.notify_one();
        }

        fn grant(&self, n: u32) -> Result<(), frame::CreditError> {
            self.sending().flow.grant(n)?;
            self.send_cv.notify_one();
            Ok(())
        }

        /// The other relay's answer to this end's `OPEN`.
        fn opened(&self, ok: bool) -> Result<(), String> {
            let mut s = self.sending();
            if s.open != Opening::Waiting {
                return Err("a second answer to its OPEN".into());
            }
            s.open = if ok { Opening::Open } else { Opening::Refused };
            self.send_cv.notify_all();
            Ok(())
        }

        fn wait_open(&self, wait: Duration) -> Result<(), String> {
            let deadline = Instant::now() + wait;
            let mut s = self.sending();
            loop {
                match s.open {
                    Opening::Open => return Ok(()),
                    Opening::Refused => {
                        return Err("the other relay has no connection waiting with its key".into())
                    }
                    Opening::Waiting => {}
                }
                if self.broken() {
                    return Err("the link broke before the other relay answered".into());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("no answer to its OPEN from the other relay in time".into());
                }
                s = self
                    .send_cv
                    .wait_timeout(s, left.min(TICK))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }

        /// Waits a little for credit; the credit in hand.
        fn credit(&self, wait: Option<Duration>) -> u32 {
            let s = self.sending();
            let s = match wait {
                Some(w) if s.flow.credit_bytes() == 0 && !self.broken() => {
                    self.send_cv
                        .wait_timeout(s, w)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                _ => s,
            };
            s.flow.credit_bytes()
        }

        /// Wakes the program waiting for what `m` moved: on this host by a
        /// byte on its client socket, and through the other relay by a
        /// doorbell on the TCP connection, as its waiters asked (asked
        /// `via` that way).
        fn wake(&self, m: &Moved, via: Via) -> Result<(), String> {
            // A full client socket is already readable, and a closed one
            // means the program is gone.
            if m.wake_here && send_byte(self.client.as_raw_fd()) {
                self.bells_here.fetch_add(1, Ordering::Relaxed);
            }
            if m.wake_peer {
                self.bells_asked.fetch_add(1, Ordering::Relaxed);
                self.push(Kind::Bell, &[], via)?;
            }
            Ok(())
        }

        /// Sends a byte on the TCP connection: the other host's program
        /// wakes.
        fn ring_tcp(&self) {
            // A failure (the connection gone) shows up in the programs'
            // own calls.
            if send_byte(self.tcp.as_raw_fd()) {
                self.bells_rung.fetch_add(1, Ordering::Relaxed);
            }
        }

        /// Resets the TCP connection (both programs see an error), once;
        /// `tell_peer`: the break is this side's, so the other relay
        /// resets its side too.
        fn reset(&self, tell_peer: bool) {
            if !self.broken.swap(true, Ordering::SeqCst) {
                if tell_peer {
                    let _ = self.push(Kind::Reset, &[], Via::Queue);
                }
                reset_tcp(self.tcp.as_raw_fd());
                self.ring.closing();
            }
            // Under each lock, so a waiter between its check and its
            // sleep cannot miss it.
            drop(self.inbox());
            self.inbox_cv.notify_all();
            drop(self.sending());
            self.send_cv.notify_all();
        }
    }

    /// Sends one wake-up byte on `fd` without waiting; whether it went.
    fn send_byte(fd: RawFd) -> bool {
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
    fn check_tcp(fd: RawFd) -> Result<(), String> {
        let opt = |name| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `v` is valid for writes of `len` bytes.
            let r = unsafe {
                libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len)
            };
            (r == 0).then_some(v)
        };
        if opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM)
            || opt(libc::SO_PROTOCOL) != Some(libc::IPPROTO_TCP)
        {
            return Err("the connection's descriptor is not a TCP socket".into());
        }
        Ok(())
    }

    fn tcp_addrs(fd: RawFd) -> Result<(IpAddr, IpAddr), String> {
        let local = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd)
            .map_err(|e| format!("getsockname: {e}"))?;
        let peer = nix::sys::socket::getpeername::<nix::sys::socket::SockaddrStorage>(fd)
            .map_err(|e| format!("getpeername: {e}"))?;
        let ip = |a: &nix::sys::socket::SockaddrStorage| -> Option<IpAddr> {
            if let Some(v4) = a.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            let v6 = a.as_sockaddr_in6()?.ip();
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        };
        match (ip(&local), ip(&peer)) {
            (Some(l), Some(p)) => Ok((l, p)),
            _ => Err("the TCP socket is not an IP connection".into()),
        }
    }

    /// The owner of the file or socket `fd` (`fstat`: a socket's is the
    /// user whose process made it, or accepted it).
    fn owner(fd: RawFd) -> Result<u32, String> {
        // SAFETY: all-zero bytes are a valid stat; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(format!("fstat: {}", io::Error::last_os_error()));
        }
        Ok(st.st_uid)
    }

    /// Whether the TCP socket `fd` is an established connection (the
    /// first byte of `TCP_INFO` is the state).
    fn established(fd: RawFd) -> bool {
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
        r == 0 && len >= 1 && info[0] == TCP_ESTABLISHED
    }

    /// `TCP_ESTABLISHED` of the kernel's TCP states (`include/net/tcp_states.h`).
    const TCP_ESTABLISHED: u8 = 1;

    /// What the relay's rules look at of a request's descriptors and of
    /// this host ([`policy::check_socket`] decides).
    fn socket_facts(r: &Request) -> Result<SocketFacts, String> {
        let fd = r.tcp.as_raw_fd();
        check_tcp(fd)?;
        let socket_uid = owner(fd)?;
        let region_uid = owner(r.region.as_raw_fd())?;
        let unspecified = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        let (established, (local, peer)) = match tcp_addrs(fd) {
            Ok(a) => (established(fd), a),
            Err(_) => (false, (unspecified, unspecified)),
        };
        let addrs: Vec<_> = nix::ifaddrs::getifaddrs()
            .map_err(|e| format!("getifaddrs: {e}"))?
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

    /// Resets the TCP connection on `fd` (shared with the program): both
    /// programs see an error.
    fn reset_tcp(fd: RawFd) {
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
    fn pump(conn: &Arc<Conn>, link: &Link, client: &OwnedFd, who: &str) {
        let who = format!("{who} [{:#x}]", conn.id);
        let t0 = Instant::now();
        let c2 = Arc::clone(conn);
        let incoming = std::thread::Builder::new()
            .name("relay-in".into())
            .spawn(move || {
                let r = queue_to_ring(&c2);
                if r.is_err() {
                    // The sending side stops at once, and both programs
                    // see the reset.
                    c2.reset(true);
                }
                r
            });
        if incoming.is_err() {
            conn.reset(true);
        }
        let out = ring_to_flow(conn, client.as_raw_fd());
        if let Err(e) = &out {
            log!("{who}: sending: {e}");
            conn.reset(true);
        }
        let inn = match incoming {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err("the receiving thread panicked".into())),
            Err(e) => Err(format!("no receiving thread: {e}")),
        };
        if let Err(e) = &inn {
            log!("{who}: receiving: {e}");
            conn.reset(true);
        }
        link.unregister(conn.id);
        log!(
            "{who}: connection {} after {} ms: relayed_out_bytes={} relayed_in_bytes={} discarded_bytes={} bells_asked={} bells_rung={} bells_here={}",
            if out.is_ok() && inn.is_ok() { "closed" } else { "reset" },
            t0.elapsed().as_millis(),
            conn.relayed_out_bytes.load(Ordering::Relaxed),
            conn.relayed_in_bytes.load(Ordering::Relaxed),
            conn.discarded_bytes.load(Ordering::Relaxed),
            conn.bells_asked.load(Ordering::Relaxed),
            conn.bells_rung.load(Ordering::Relaxed),
            conn.bells_here.load(Ordering::Relaxed),
        );
    }

    /// Most doorbell messages [`wait_client`] reads in one call.
    const MAX_DOORBELLS_A_WAKE: usize = 64;

    /// Whether `fd` (the client socket) is readable within `ms`, and
    /// drains it; Err: the program closed its last descriptor of the
    /// connection (end of file or hang-up).
    fn wait_client(fd: RawFd, ms: libc::c_int) -> Result<(), ()> {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r <= 0 {
            return Ok(());
        }
        let mut scratch = [0u8; 256];
        // The program's doorbells, at most a bounded number a call: a
        // program flooding its socket wakes only its own connection's
        // thread, which still looks at its ring between calls.
        for _ in 0..MAX_DOORBELLS_A_WAKE {
            // SAFETY: `scratch` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    fd,
                    scratch.as_mut_ptr().cast(),
                    scratch.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                continue;
            }
            if n == 0 {
                return Err(());
            }
            let e = io::Error::last_os_error().raw_os_error();
            return if matches!(e, Some(libc::EAGAIN) | Some(libc::EINTR)) {
                Ok(())
            } else {
                Err(())
            };
        }
        Ok(())
    }

    /// The program's ring to the link, within the connection's credit,
    /// until the program is done with the connection (then what is left
    /// and `END`) or the connection breaks.
    fn ring_to_flow(c: &Conn, client: RawFd) -> Result<(), String> {
        // A DATA frame is built in place: the ring is read behind room for
        // its header.
        let mut buf = vec![0u8; frame::HEADER_BYTES + frame::CHUNK_BYTES];
        let mut closing = false;
        let corrupt = |Corrupt| "the program's ring is corrupt".to_string();
        loop {
            if c.broken() {
                return Err("the connection broke".into());
            }
            let credit = c.credit(None) as usize;
            if credit > 0 {
                let room = frame::HEADER_BYTES + credit.min(frame::CHUNK_BYTES);
                let m = c
                    .ring
                    .read(&mut buf[frame::HEADER_BYTES..room])
                    .map_err(corrupt)?;
                if m.bytes > 0 {
                    c.sending().flow.spend(m.bytes as u32);
                    buf[..frame::HEADER_BYTES].copy_from_slice(&frame::encode(
                        Kind::Data,
                        c.id,
                        m.bytes,
                    ));
                    c.out
                        .send(&buf[..frame::HEADER_BYTES + m.bytes], Via::Now)?;
                    c.relayed_out_bytes
                        .fetch_add(m.bytes as u64, Ordering::Relaxed);
                    c.wake(&m, Via::Now)?;
                    continue;
                }
            }
            c.ring.want_data();
            if c.ring.readable().map_err(corrupt)? > 0 {
                if credit == 0 {
                    // The other program reads slower: its relay's queue
                    // is full. Only this connection waits.
                    c.credit(Some(TICK));
                }
                continue;
            }
            if closing {
                // Every byte the program wrote was published before its
                // close, and is sent.
                c.push(Kind::End, &[], Via::Now)?;
                return Ok(());
            }
            if wait_client(client, TICK.as_millis() as libc::c_int).is_err() {
                closing = true;
                c.program_gone.store(true, Ordering::SeqCst);
            }
        }
    }

    /// The connection's queue to the program's ring, returning credit as
    /// bytes leave it, until the other relay's `END` (then the program
    /// reads the end of the stream) or the connection breaks.
    fn queue_to_ring(c: &Conn) -> Result<(), String> {
        loop {
            let chunk = {
                let mut i = c.inbox();
                loop {
                    if c.broken() {
                        return Err("the connection broke".into());
                    }
                    if let Some(v) = i.chunks.pop_front() {
                        i.writing = true;
                        break Some(v);
                    }
                    if i.end {
                        break None;
                    }
                    i = c
                        .inbox_cv
                        .wait_timeout(i, TICK)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            };
            let Some(v) = chunk else {
                // The end: everything is in the ring; the program reads
                // the end of the stream once it has read it.
                // SAFETY: a plain shutdown of our duplicate of the
                // connection's socket.
                unsafe { libc::shutdown(c.tcp.as_raw_fd(), libc::SHUT_RD) };
                c.ring.closing();
                return Ok(());
            };
            let put = put_all(c, &v);
            let back = {
                let mut i = c.inbox();
                i.writing = false;
                put?;
                i.flow.moved(v.len() as u32)
            };
            c.relayed_in_bytes
                .fetch_add(v.len() as u64, Ordering::Relaxed);
            if let Some(n) = back {
                c.push(Kind::Credit, &n.to_le_bytes(), Via::Now)?;
            }
        }
    }

    /// Puts all of `data` into the program's ring, waiting for room.
    fn put_all(c: &Conn, mut data: &[u8]) -> Result<(), String> {
        let mut round = 0u32;
        while !data.is_empty() {
            if c.broken() {
                return Err("the connection broke".into());
            }
            if c.program_gone.load(Ordering::SeqCst) {
                c.discarded_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(());
            }
            let m = c
                .ring
                .write(data)
                .map_err(|Corrupt| "the program's ring is corrupt")?;
            c.wake(&m, Via::Now)?;
            if m.bytes > 0 {
                data = &data[m.bytes..];
                round = 0;
                continue;
            }
            // The program reads slower than the link: look again after
            // 1, 2, 4 … 16 ms (its doorbells go to the other thread).
            std::thread::sleep(Duration::from_millis(1 << round.min(4)));
            round += 1;
        }
        Ok(())
    }

    /// The program broke the ring's invariants.
    struct Corrupt;

    /// Bytes moved and how the program waiting for them is woken.
    struct Moved {
        bytes: usize,
        /// By a doorbell on the TCP connection, which the other relay
        /// sends.
        wake_peer: bool,
        /// By a byte on its socket to this relay.
        wake_here: bool,
    }

    /// The relay's end of a library's region (`netgap_shm`'s layout and
    /// ring): as the region's listener, the relay consumes ring 0 (the
    /// program's output) and produces ring 1 (its input). The ends keep
    /// the mapping.
    struct FarEnd {
        rx: Consumer,
        tx: Producer,
    }

    /// Bytes moved and the waiters `taken` after the move: a waiter in
    /// poll or epoll is woken by a doorbell on the TCP connection (as the
    /// library's channel does), one whose epoll watches its relay socket
    /// by a byte on the client socket; `netgap_shm` already woke the
    /// blocking sleepers.
    fn moved(bytes: usize, taken: Option<u32>) -> Moved {
        let bits = taken.unwrap_or(0);
        Moved {
            bytes,
            wake_peer: bits & shm_wait::WAIT_FD != 0,
            wake_here: bits & shm_wait::WAIT_BELL != 0,
        }
    }

    impl FarEnd {
        /// Checks the region (a memfd sealed against shrinking and
        /// growing, of exactly the size its rings need, with a header of
        /// this layout for rings of `capacity`) and maps it.
        fn map(fd: RawFd, capacity: usize) -> Result<FarEnd, String> {
            let len = netgap_shm::region_bytes(capacity);
            // SAFETY: all-zero bytes are a valid stat; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `st` is valid for writes.
            let r = unsafe { libc::fstat(fd, &mut st) };
            // SAFETY: a plain fcntl on our descriptor.
            let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
            let sealed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            if r != 0
                || st.st_mode & libc::S_IFMT != libc::S_IFREG
                || st.st_size != len as libc::off_t
                || seals < 0
                || seals & sealed != sealed
            {
                return Err("the region is not a sealed memfd of the announced size".into());
            }
            let expect = Expect {
                capacity: Some(capacity),
                waits: Waits::Sleep,
            };
            let region = Region::open(fd, &expect, false).map_err(|e| e.to_string())?;
            let (tx, rx) = region.ends(Role::Listener);
            Ok(FarEnd { rx, tx })
        }

        fn readable(&self) -> Result<usize, Corrupt> {
            self.rx.available().map(|n| n as usize).map_err(|_| Corrupt)
        }

        /// Copies up to `buf.len()` bytes of the program's output out.
        fn read(&self, buf: &mut [u8]) -> Result<Moved, Corrupt> {
            let n = self.rx.try_read(buf, usize::MAX).map_err(|_| Corrupt)?;
            if n == 0 {
                return Ok(moved(0, None));
            }
            Ok(moved(n, self.rx.take_peer_waiters(|| ())))
        }

        /// Copies as much of `data` as fits into the program's input.
        fn write(&self, data: &[u8]) -> Result<Moved, Corrupt> {
            let n = self.tx.try_write(data, usize::MAX).map_err(|_| Corrupt)?;
            if n == 0 {
                return Ok(moved(0, None));
            }
            Ok(moved(n, self.tx.take_peer_waiters(|| ())))
        }

        /// Announces a wait for the program's output (the program's
        /// doorbell comes on the client socket).
        fn want_data(&self) {
            self.rx.arm(shm_wait::WAIT_FD);
        }

        /// The far side ended or the connection broke: the closing hint on
        /// the program's input ring, and its blocking sleepers woken, so
        /// they look at the TCP socket (for its end or reset) at once
        /// instead of after their sleep's time limit.
        fn closing(&self) {
            self.tx.hint_closing();
            self.tx.wake_peer_sleepers();
            self.rx.wake_peer_sleepers();
        }
    }

    #[cfg(test)]
    #[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
    mod tests {
        use super::*;
        use netgap_transport::FlowError;

        /// A receiver that replays `bytes`, then says the flow closed.
        struct Script(VecDeque<u8>);

        impl Receiver for Script {
            fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
                if self.0.is_empty() {
                    return Err(FlowError::Closed);
                }
                let n = buf.len().min(self.0.len());
                for (d, s) in buf.iter_mut().zip(self.0.drain(..n)) {
                    *d = s;
                }
                Ok(n)
            }
        }

        const RING_BYTES: usize = 4096;

        /// A region as the library makes it: a sealed memfd with the
        /// header, mapped as the relay maps it.
        fn region() -> FarEnd {
            // SAFETY: a NUL-terminated name and plain flags.
            let fd = unsafe {
                libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            };
            assert!(fd >= 0);
            // SAFETY: our own new descriptor.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let header = netgap_shm::HeaderFields {
                waits: Waits::Sleep,
                capacity: RING_BYTES as u64,
                connector_ino: 0,
                listener_ino: 0,
            }
            .to_bytes();
            // SAFETY: plain calls on our own memfd; `header` is valid for
            // reads of its length.
            unsafe {
                assert_eq!(
                    libc::ftruncate(
                        fd.as_raw_fd(),
                        netgap_shm::region_bytes(RING_BYTES) as libc::off_t
                    ),
                    0
                );
                assert_eq!(
                    libc::pwrite(fd.as_raw_fd(), header.as_ptr().cast(), header.len(), 0),
                    header.len() as isize
                );
                assert_eq!(
                    libc::fcntl(
                        fd.as_raw_fd(),
                        libc::F_ADD_SEALS,
                        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
                    ),
                    0
                );
            }
            FarEnd::map(fd.as_raw_fd(), RING_BYTES).unwrap()
        }

        /// Some descriptor standing for the TCP socket (a reset or a bell
        /// on it fails harmlessly).
        fn not_a_socket() -> OwnedFd {
            std::fs::File::open("/dev/null").unwrap().into()
        }

        /// A connection's ends: a ring and stand-ins for both sockets.
        fn ends() -> Ends {
            Ends {
                ring: region(),
                tcp: not_a_socket(),
                client: not_a_socket(),
            }
        }

        fn hub() -> Arc<Hub> {
            Arc::new(Hub {
                links: Mutex::new(HashMap::new()),
                cv: Condvar::new(),
                pending: Mutex::new(HashMap::new()),
                timeout: Duration::from_secs(1),
                max_links: 64,
                iface: XdpInterface {
                    name: "eth1".into(),
                    ip: "10.0.0.1".parse().unwrap(),
                    prefix_len: 24,
                    mac: [2, 0, 0, 0, 0, 1],
                },
                served: policy::Served::parse(&["10.0.1.0/24".into()]).unwrap(),
                relay_key: netgap_proto::auth::Key::from_bytes(vec![9; 32]).unwrap(),
                journal: Journal::new(),
            })
        }

        /// A link of the listening end (its ids have the top bit clear)
        /// and what it sends.
        fn link() -> (Arc<Link>, mpsc::Receiver<Out>) {
            let (out, rx) = mpsc::channel();
            let link = Arc::new(Link::new(
                Arc::new(Outbox::new(out, None)),
                "10.0.0.2/02:00:00:00:00:02/7".into(),
                "10.0.0.1/02:00:00:00:00:01/7".into(),
                ("10.0.0.1".parse().unwrap(), "10.0.1.1".parse().unwrap()),
                7,
                0,
            ));
            (link, rx)
        }

        /// An open connection `id` on `link`.
        fn conn(link: &Link, id: u32) -> Arc<Conn> {
            let c = Arc::new(Conn::new(id, ends(), Arc::clone(&link.out), true));
            link.lock().map.insert(id, Arc::clone(&c));
            c
        }

        fn script(frames: &[Vec<u8>]) -> Script {
            Script(frames.iter().flatten().copied().collect())
        }

        /// The frames the link sent: (kind, id).
        fn sent(rx: &mpsc::Receiver<Out>) -> Vec<(Kind, u32)> {
            rx.try_iter()
                .filter_map(|o| match o {
                    Out::Frame(f) => {
                        let h =
                            frame::decode(&f[..frame::HEADER_BYTES].try_into().unwrap()).unwrap();
                        Some((h.kind, h.id))
                    }
                    Out::Close | Out::Broken(_) => None,
                })
                .collect()
        }

        fn close() -> Vec<u8> {
            frame::frame(Kind::LinkClose, 0, &[])
        }

        #[test]
        fn frames_for_unknown_connections_are_counted_and_dropped() {
            let (link, _rx) = link();
            let c = conn(&link, 0x8000_0001);
            let mut s = script(&[
                frame::frame(Kind::Data, 0x8000_0009, b"late"),
                frame::frame(Kind::Bell, 0x8000_0009, &[]),
                frame::frame(Kind::End, 0x8000_0009, &[]),
                frame::frame(Kind::Credit, 0x8000_0009, &100u32.to_le_bytes()),
                frame::frame(Kind::Data, 0x8000_0001, b"hello"),
                frame::frame(Kind::Ping, 0, &[]),
                frame::frame(Kind::End, 0x8000_0001, &[]),
                close(),
            ]);
            reader(&link, &hub(), &mut s).unwrap();
            assert_eq!(link.unknown_id_frames.load(Ordering::Relaxed), 4);
            // Nothing was queued before it: straight into the ring.
            assert_eq!(program_input(&c.ring), b"hello");
            let i = c.inbox();
            assert!(i.chunks.is_empty());
            assert!(i.end);
        }

        /// What the relay put in the program's ring (ring 1) and the
        /// program has not read, taken as the program would read it.
        fn program_input(r: &FarEnd) -> Vec<u8> {
            r.tx.take_back().ok().unwrap()
        }

        /// Data that finds the ring full queues behind what fills it, in
        /// order; the reader never waits.
        #[test]
        fn data_past_the_rings_room_queues_in_order() {
            let (link, _rx) = link();
            let c = conn(&link, 0x8000_0001);
            let a: Vec<u8> = (0..RING_BYTES + 100).map(|k| k as u8).collect();
            let mut s = script(&[
                frame::frame(Kind::Data, 0x8000_0001, &a),
                frame::frame(Kind::Data, 0x8000_0001, b"next"),
                close(),
            ]);
            reader(&link, &hub(), &mut s).unwrap();
            assert_eq!(program_input(&c.ring), a[..RING_BYTES]);
            let i = c.inbox();
            let queued: Vec<u8> = i.chunks.iter().flatten().copied().collect();
            assert_eq!(queued[..100], a[RING_BYTES..]);
            assert_eq!(&queued[100..], b"next");
            assert_eq!(i.flow.queued_bytes(), 104);
        }

        #[test]
        fn data_past_a_connections_credit_breaks_the_link() {
            let (link, _rx) = link();
            let _c = conn(&link, 0x8000_0001);
            let chunk = vec![7u8; frame::CHUNK_BYTES];
            let mut frames: Vec<Vec<u8>> = (0..frame::WINDOW_BYTES as usize / frame::CHUNK_BYTES)
                .map(|_| frame::frame(Kind::Data, 0x8000_0001, &chunk))
                .collect();
            // The first chunk's first RING_BYTES went to the ring and are
            // not queued: this is one byte past the window.
            frames.push(frame::frame(
                Kind::Data,
                0x8000_0001,
                &vec![7u8; RING_BYTES + 1],
            ));
            let e = reader(&link, &hub(), &mut script(&frames)).unwrap_err();
            assert!(e.contains("past the"), "{e}");
        }

        #[test]
        fn credit_past_the_window_and_malformed_frames_break_the_link() {
            let (link, _rx) = link();
            let _c = conn(&link, 0x8000_0001);
            let over = frame::frame(Kind::Credit, 0x8000_0001, &1u32.to_le_bytes());
            let e = reader(&link, &hub(), &mut script(&[over])).unwrap_err();
            assert!(e.contains("past the"), "{e}");
            let mut bad = frame::frame(Kind::Bell, 0x8000_0001, &[]);
            bad[1] = 9;
            let e = reader(&link, &hub(), &mut script(&[bad])).unwrap_err();
            assert!(e.contains("a bad frame"), "{e}");
            let hello = frame::frame(Kind::LinkHello, 0, b"10.0.0.1/02:00:00:00:00:01/7");
            let e = reader(&link, &hub(), &mut script(&[hello])).unwrap_err();
            assert!(e.contains("second hello"), "{e}");
            // The flow ending without LINK_CLOSE is a broken link.
            assert!(reader(&link, &hub(), &mut script(&[])).is_err());
        }

        #[test]
        fn an_open_takes_only_the_connection_waiting_with_its_key() {
            let (link, rx) = link();
            let hub = hub();
            let (give, take) = mpsc::sync_channel(1);
            hub.register([5u8; frame::KEY_BYTES], Pending { ends: ends(), give })
                .unwrap();
            let mut s = script(&[
                frame::frame(Kind::Open, 0x8000_0001, &[6u8; frame::KEY_BYTES]),
                frame::frame(Kind::Open, 0x8000_0002, &[5u8; frame::KEY_BYTES]),
                close(),
            ]);
            reader(&link, &hub, &mut s).unwrap();
            assert_eq!(
                sent(&rx),
                [
                    (Kind::OpenRefused, 0x8000_0001),
                    (Kind::OpenOk, 0x8000_0002)
                ]
            );
            let (c, _) = take.try_recv().unwrap();
            assert_eq!(c.id, 0x8000_0002);
            assert!(hub.pending().is_empty());
            // An OPEN with one of this end's own ids is a fault.
            let own = frame::frame(Kind::Open, 3, &[5u8; frame::KEY_BYTES]);
            let e = reader(&link, &hub, &mut script(&[own])).unwrap_err();
            assert!(e.contains("an id of this end"), "{e}");
        }

        /// A flow's sending half that keeps what it is given.
        struct Wire(Arc<Mutex<Vec<u8>>>);

        impl Sender for Wire {
            fn send_some(&mut self, buf: &[u8]) -> Result<usize, netgap_transport::FlowError> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
        }

        /// A connection's frame goes out on its own thread only when
        /// nothing waits in the writing thread's queue: it never overtakes
        /// a queued frame.
        #[test]
        fn a_frame_sent_at_once_never_overtakes_a_queued_one() {
            let wire = Arc::new(Mutex::new(Vec::new()));
            let (q, rx) = mpsc::channel();
            let out = Outbox::new(q, Some(Box::new(Wire(Arc::clone(&wire)))));
            let f = |id| frame::frame(Kind::Bell, id, &[]);
            out.send(&f(1), Via::Now).unwrap();
            assert_eq!(*wire.lock().unwrap(), f(1));
            // The receiving thread's frame waits for the writing thread;
            // what a connection sends after it waits behind it.
            out.send(&f(2), Via::Queue).unwrap();
            out.send(&f(3), Via::Now).unwrap();
            assert_eq!(*wire.lock().unwrap(), f(1));
            for o in rx.try_iter() {
                let Out::Frame(fr) = o else { panic!() };
                out.send_queued(&fr).unwrap();
            }
            out.send(&f(4), Via::Now).unwrap();
            assert_eq!(*wire.lock().unwrap(), [f(1), f(2), f(3), f(4)].concat());
            assert_eq!(out.frames_out.load(Ordering::Relaxed), 4);
            // The writing thread gone with the flow's half: a send fails
            // and says the link is broken.
            drop(out.sender().take());
            assert!(out.send(&f(5), Via::Now).is_err());
            assert!(matches!(rx.try_recv(), Ok(Out::Broken(_))));
        }

        #[test]
        fn a_broken_link_resets_every_connection_and_says_close() {
            let (link, rx) = link();
            let a = conn(&link, 0x8000_0001);
            let b = conn(&link, 0x8000_0002);
            link.shut("test");
            assert!(a.broken() && b.broken());
            assert!(link.closing() && link.idle());
            assert!(matches!(rx.try_iter().last(), Some(Out::Close)));
            // A second shut is a no-op.
            link.shut("again");
            assert_eq!(link.why.lock().unwrap().as_deref(), Some("test"));
        }
    }
}
