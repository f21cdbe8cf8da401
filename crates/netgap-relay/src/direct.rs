//! A direct connection's setup (`netgap_proto::direct`): the relay makes
//! the program an AF_XDP socket of its own on a queue of the connection's
//! own, registers the connection in the interface's shared steering, and
//! hands the socket and its UMEM over; it keeps only the registration
//! and the program's relay socket, and when that socket hangs up (the
//! program closed it, exited or died) the registration goes and the queue
//! is free again.
//!
//! The exchange on the relay socket (`SOCK_SEQPACKET`, one datagram per
//! message): the program sends a `DirectRequest` with its connection's
//! TCP socket, checked as a listen's or a connect's is (the asker's own
//! connected socket, to a host the relay serves, not over the xdp
//! interface). The accepting side first gets `RelayReply::Ok(target)`,
//! this relay's end of the link to the other host (the link opened as a
//! listen opens it when there is none), for its hello's answer. Both
//! sides then get one datagram: the `DirectGrant`'s 32 bytes followed by
//! the port's geometry, with the AF_XDP socket and the UMEM's memfd as
//! `SCM_RIGHTS` (`handover::send_after`); or a `RelayReply::Refused` with
//! the reason, on which the library keeps the connection on the relay's
//! path. The queue is agreed over the link: the connecting side's relay
//! sends `QUEUE_OFFER` (a quarter of its free queues, at most
//! `queues::OFFER_QUEUES`, reserved meanwhile, and its program's flow id), the accepting side's answers `QUEUE_ANSWER` once
//! its program asked (`rendezvous`), after it made its own port.

use crate::host::{neighbour, tcp_facts};
use crate::hub::{DirectHub, Event, Hub, Parked};
use crate::link::Link;
use crate::open::{flow_config, Asker, OpenError};
use crate::policy::{self, LinkId};
use crate::queues::{QueueError, Queues};
use crate::rendezvous::{AcceptStep, Key, PendingError, Rendezvous, DIRECT_WAIT};
use crate::request::reply;
use crate::server::Slot;
use crate::table::Role;
use crate::{RelayConfig, TICK};
use netgap_proto::dataproof::FlowKey;
use netgap_proto::direct::{DirectGrant, DirectRequest, DirectRole, QueueAnswer, QueueOffer};
use netgap_proto::preload::RelayReply;
use netgap_proto::relay::Kind;
use netgap_transport::xdp::{parse_addr, Xdp, XdpAddr};
use netgap_transport::Transport;
pub(crate) use port::Spares;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a direct request is refused; the refusal's text is this one line.
#[derive(Debug, Error)]
pub(crate) enum DirectError {
    /// The relay was started with `--no-direct`.
    #[error("direct connections are off on this relay (--no-direct)")]
    Off,
    /// The request's socket, its target or the link, as for a relayed
    /// connection.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The waiting table is full or the key is taken.
    #[error(transparent)]
    Pending(#[from] PendingError),
    /// No queue here, or none at both ends.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The other relay has no queue free at both ends (or refused).
    #[error("the other relay has no queue for the connection")]
    NoQueue,
    /// The other half did not come in time.
    #[error("no {0} from the other relay within {DIRECT_WAIT:?}")]
    Late(&'static str),
    /// The kernel did not make or register the socket.
    #[error("the kernel cannot make the connection's socket: {0}")]
    Port(std::io::Error),
    /// No random flow id.
    #[error("no random flow id: {0}")]
    Random(std::io::Error),
    /// The grant could not be handed over.
    #[error("handing the socket over: {0}")]
    Hand(std::io::Error),
}

/// The direct connections' state for a relay on `config`'s interface
/// with `rx_queues` receive queues.
pub(crate) fn hub_part(config: &RelayConfig, rx_queues: u16) -> DirectHub {
    DirectHub {
        meet: Mutex::new(Rendezvous::new(config.max_per_uid, config.max_total)),
        queues: Arc::new(Mutex::new(Queues::new(
            &config.interface,
            rx_queues,
            config.max_direct_per_uid,
        ))),
        next_token: AtomicU64::new(1),
        spares: port::spares(&config.interface),
    }
}

/// Answers `NoQueue` to the other relays' offers parked past their
/// wait, every few ticks, so that no parked offer holds its link after
/// its wait even when nothing else comes.
pub(crate) fn spawn_sweeper(hub: &Arc<Hub>) {
    if hub.direct.is_none() {
        return;
    }
    let hub = Arc::clone(hub);
    let spawned = std::thread::Builder::new()
        .name("relay-direct-sweep".into())
        .spawn(move || loop {
            std::thread::sleep(TICK * 4);
            if let Some(d) = &hub.direct {
                let expired = d.meet().expired(Instant::now());
                for p in expired {
                    p.link.0.answer(p.offer.key, QueueAnswer::NoQueue);
                }
            }
        });
    if let Err(e) = spawned {
        log!("no thread for the parked offers' expiry (they expire as others come): {e}");
    }
}

/// A flow id for this end's program: random, never 0.
fn random_flow() -> std::io::Result<u16> {
    loop {
        let mut b = [0u8; 2];
        // SAFETY: `b` is valid for writes of its length.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n != 2 {
            return Err(std::io::Error::last_os_error());
        }
        let f = u16::from_le_bytes(b);
        if f != 0 {
            return Ok(f);
        }
    }
}

/// A queue this relay holds for a granted connection, free again on
/// drop.
struct HeldQueue {
    queues: Arc<Mutex<Queues>>,
    queue: u16,
}

impl Drop for HeldQueue {
    fn drop(&mut self) {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(self.queue);
    }
}

/// Serves one direct request, then holds its grant until the client
/// hangs up.
///
/// `slot` is the client's place in the relay's connections per uid: it
/// is given back once the grant is handed over, since from then on the
/// relay keeps only a registration and a waiting thread, which the
/// queues per uid bound; a program that closes its connection does not
/// count it against its next one while the close lingers (the kernel's
/// own closed sockets in `FIN_WAIT` or `TIME_WAIT` count against none of
/// the program's limits either). The queue itself stays held until the
/// program hangs up, since frames of the close may still come to it.
pub(crate) fn serve(
    hub: &Arc<Hub>,
    req: DirectRequest,
    tcp: OwnedFd,
    client: &OwnedFd,
    asker: &Asker,
    slot: Slot,
) {
    let fd = client.as_raw_fd();
    let asked = Instant::now();
    let granted = match &hub.direct {
        None => Err(DirectError::Off),
        Some(d) => match &req.role {
            DirectRole::Accept => accept(hub, d, &req, &tcp, fd, asker).inspect_err(|_| {
                // The connecting side's offer, come or coming, is
                // answered at once.
                refuse_offer(d, req.key);
            }),
            DirectRole::Connect { target } => connect(hub, d, &req, target, &tcp, asker),
        },
    };
    let (grant, made, held) = match granted {
        Ok(g) => g,
        Err(why) => {
            asker.say(
                hub,
                &format!(
                    "direct: refused: {why} (after {} ms)",
                    asked.elapsed().as_millis()
                ),
            );
            reply(fd, &RelayReply::Refused(why.to_string()));
            return;
        }
    };
    let queue = grant.queue;
    let port::Made { port, registration } = made;
    if let Err(e) = port::hand_over(fd, &grant, port) {
        asker.say(hub, &format!("direct: refused: {}", DirectError::Hand(e)));
        return;
    }
    drop(slot);
    if matches!(req.role, DirectRole::Accept) {
        // The relayed listen that waited beside it for the connector's
        // fallback gives its place back now, not when its wait ends.
        hub.went_direct(&req.key);
    }
    asker.say(
        hub,
        &format!(
            "direct: granted queue {queue} in {} ms (this end's flow {}, the other's {})",
            asked.elapsed().as_millis(),
            grant.local_flow,
            grant.peer_flow
        ),
    );
    let t0 = Instant::now();
    {
        // The registration and the queue go when the program hangs up.
        let _kept = (registration, held);
        wait_hangup(fd);
    }
    log!(
        "{}: direct connection on queue {queue} closed after {} ms: queue {queue} is free again",
        asker.who,
        t0.elapsed().as_millis()
    );
}

/// The accepting program's request of `key` is refused here: an offer
/// parked for it is answered `NoQueue` now, one still coming when it
/// comes.
pub(crate) fn refuse_offer(d: &DirectHub, key: Key) {
    let parked = d.meet().refuse(key, Instant::now());
    if let Some(p) = parked {
        p.link.0.answer(p.offer.key, QueueAnswer::NoQueue);
    }
}

/// Waits until the client hangs up; anything it sends meanwhile is read
/// and dropped.
fn wait_hangup(fd: RawFd) {
    let mut buf = [0u8; 256];
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, TICK.as_millis() as libc::c_int) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
        if n <= 0 {
            continue;
        }
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP) != 0 {
            return;
        }
        // SAFETY: `buf` is valid for writes of its length.
        let got = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if got == 0 {
            return;
        }
    }
}

type Granted = (DirectGrant, port::Made, HeldQueue);

/// The asker's TCP socket checked by the relay's rules; its two
/// addresses.
fn check_tcp(hub: &Hub, tcp: &OwnedFd, asker: &Asker) -> Result<(IpAddr, IpAddr), OpenError> {
    let facts = tcp_facts(tcp.as_raw_fd(), None)?;
    policy::check_socket(asker.uid, &facts, &hub.served, &hub.iface)?;
    Ok((facts.local, facts.peer))
}

/// The accepting side: the link's end to the program, then the offer
/// (waited for, or there first), the queue, the port, the answer.
fn accept(
    hub: &Arc<Hub>,
    d: &DirectHub,
    req: &DirectRequest,
    tcp: &OwnedFd,
    client: RawFd,
    asker: &Asker,
) -> Result<Granted, DirectError> {
    let (tcp_local, tcp_peer) = check_tcp(hub, tcp, asker)?;
    let (give, take) = mpsc::sync_channel(1);
    let now = Instant::now();
    let step = {
        let mut meet = d.meet();
        let expired = meet.expired(now);
        for p in expired {
            p.link.0.answer(p.offer.key, QueueAnswer::NoQueue);
        }
        meet.accept(req.key, asker.uid, give, now)?
    };
    let name = match link_end(hub, tcp_local, tcp_peer, asker) {
        Ok(name) => name,
        Err(e) => {
            d.meet().withdraw(&req.key);
            if let AcceptStep::Matched(p) = step {
                p.link.0.answer(p.offer.key, QueueAnswer::NoQueue);
            }
            return Err(e.into());
        }
    };
    reply(client, &RelayReply::Ok(name));
    let parked = match step {
        AcceptStep::Matched(p) => p,
        AcceptStep::Parked => match take.recv_timeout(DIRECT_WAIT) {
            Ok(Event::Offer(p)) => p,
            Ok(Event::Answer(_)) | Err(_) => {
                if d.meet().withdraw(&req.key) {
                    return Err(DirectError::Late("queue offer"));
                }
                // The offer took it just now.
                match take.recv_timeout(Duration::from_secs(1)) {
                    Ok(Event::Offer(p)) => p,
                    _ => return Err(DirectError::Late("queue offer")),
                }
            }
        },
    };
    let Parked { offer, link } = parked;
    if offer.free_queues == 0 {
        // The connecting end refused its own request (no queue free or
        // its uid's cap) and said so: nobody waits for an answer.
        return Err(DirectError::NoQueue);
    }
    let answer_no = |why: DirectError| {
        link.0.answer(offer.key, QueueAnswer::NoQueue);
        why
    };
    let peer_mac = parse_addr(&link.0.peer_name)
        .map_err(|e| answer_no(OpenError::OwnAddr(e).into()))?
        .mac;
    let queue = d
        .queues()
        .take(asker.uid, offer.free_queues)
        .map_err(|e| answer_no(e.into()))?;
    let held = HeldQueue {
        queues: Arc::clone(&d.queues),
        queue,
    };
    let flow = random_flow().map_err(|e| answer_no(DirectError::Random(e)))?;
    let made = port::make(&d.spares, &hub.iface.name, queue, peer_mac, flow)
        .map_err(|e| answer_no(DirectError::Port(e)))?;
    link.0
        .answer(offer.key, QueueAnswer::Agreed { queue, flow });
    let grant = DirectGrant {
        queue,
        local_flow: flow,
        peer_flow: offer.flow,
        peer_mac,
    };
    Ok((grant, made, held))
}

/// This relay's end of the link to `tcp_peer`'s host: the link's, or a
/// new xdp listen's whose link is accepted in the background.
fn link_end(
    hub: &Arc<Hub>,
    tcp_local: IpAddr,
    tcp_peer: IpAddr,
    asker: &Asker,
) -> Result<String, OpenError> {
    let deadline = Instant::now() + crate::open::STATE_WAIT;
    if let Some(link) = hub.enter(tcp_peer, Role::Listen, |_| true, deadline)? {
        link.touch();
        return Ok(link.local_name.clone());
    }
    let opened = (|| {
        let l = Xdp
            .listen(&flow_config(hub.timeout), IpAddr::V4(hub.iface.ip))
            .map_err(OpenError::XdpListen)?;
        let name = l.addr();
        let own = parse_addr(&name).map_err(OpenError::OwnAddr)?;
        let key = LinkId::listening(&own, tcp_local, tcp_peer).flow_key(&hub.relay_key);
        Ok::<_, OpenError>((l, name, own, key))
    })();
    let (mut l, name, own, key) = match opened {
        Ok(o) => o,
        Err(e) => {
            hub.forget(tcp_peer, Role::Listen);
            return Err(e);
        }
    };
    asker.say(
        hub,
        &format!("direct: no link: listening for the other relay's flow at {name}"),
    );
    let (h, local_name) = (Arc::clone(hub), name.clone());
    let spawned = std::thread::Builder::new()
        .name("relay-direct-link".into())
        .spawn(move || {
            let up = l
                .accept(crate::open::ACCEPT_WAIT)
                .map_err(OpenError::XdpAccept)
                .and_then(|mut flow| {
                    flow.bind_session(&FlowKey::from_bytes(key))
                        .map_err(OpenError::Keying)?;
                    Ok(Link::start(&h, flow, local_name, (0, own.flow), tcp_peer)?)
                });
            if let Err(e) = up {
                h.forget(tcp_peer, Role::Listen);
                log!("direct: the link from {tcp_peer} did not open: {e}");
            }
        });
    if spawned.is_err() {
        hub.forget(tcp_peer, Role::Listen);
        return Err(OpenError::NoOpen);
    }
    Ok(name)
}

/// The link that ends at `t`, opening it when there is none, as a
/// relayed connect's: another link to that host (one crossing it, both
/// relays having opened one at once, or one the other relay lost) does
/// not serve, and is closed only when it carries nothing and is settled.
/// A crossing link stays: the other relay may owe a queue answer on it
/// (two programs that connect to each other at once, as Open MPI's ranks
/// do), which a close there would lose.
fn link_to(
    hub: &Arc<Hub>,
    t: XdpAddr,
    target: &str,
    (tcp_local, tcp_peer): (IpAddr, IpAddr),
    asker: &Asker,
) -> Result<Arc<Link>, OpenError> {
    let link_id = LinkId::connecting(&t, tcp_local, tcp_peer);
    let deadline = Instant::now() + crate::open::STATE_WAIT;
    let fits = |l: &Link| l.peer_ip == t.ip && l.flow_id == t.flow;
    hub.close_stale(tcp_peer, fits);
    match hub.enter(tcp_peer, Role::Connect, fits, deadline)? {
        Some(l) => Ok(l),
        None => crate::open::open_connecting(hub, t, target, &link_id, tcp_peer, asker)
            .inspect_err(|_| hub.forget(tcp_peer, Role::Connect)),
    }
}

/// The connecting side: the target checked, the link, the offer of this
/// end's free queues, the answer, the port.
fn connect(
    hub: &Arc<Hub>,
    d: &DirectHub,
    req: &DirectRequest,
    target: &str,
    tcp: &OwnedFd,
    asker: &Asker,
) -> Result<Granted, DirectError> {
    let t = parse_addr(target).map_err(|why| OpenError::Target {
        target: target.to_string(),
        why,
    })?;
    let (tcp_local, tcp_peer) = check_tcp(hub, tcp, asker)?;
    if t.ip == tcp_peer {
        return Err(OpenError::OwnPeer(target.to_string()).into());
    }
    policy::check_target(&t, &hub.iface, neighbour(t.ip, &hub.iface.name))
        .map_err(OpenError::from)?;
    let link = link_to(hub, t, target, (tcp_local, tcp_peer), asker)?;
    let _hold = link.hold();
    // The listener's side asked its relay too, and its relay waits for
    // this end's offer: on a refusal here, an offer of no queue refuses
    // it at once, where it would wait out DIRECT_WAIT inside its
    // program's call (a server's event loop with it).
    let refused = |why: DirectError| {
        let none = QueueOffer {
            key: req.key,
            free_queues: 0,
            flow: 1,
        };
        link.push(Kind::QueueOffer, 0, &none.encode());
        why
    };
    let token = d.next_token.fetch_add(1, Ordering::Relaxed);
    let free_queues = d
        .queues()
        .offer(
            token,
            asker.uid,
            !crate::table::LinkState::lower_here(&*link),
        )
        .map_err(|e| refused(e.into()))?;
    let settle = |agreed: Option<u16>| d.queues().settle(token, agreed);
    let flow = match random_flow() {
        Ok(f) => f,
        Err(e) => {
            let _ = settle(None);
            return Err(refused(DirectError::Random(e)));
        }
    };
    let (give, take) = mpsc::sync_channel(1);
    if let Err(e) = d.meet().ask(req.key, asker.uid, give, Instant::now()) {
        let _ = settle(None);
        return Err(refused(e.into()));
    }
    let offer = QueueOffer {
        key: req.key,
        free_queues,
        flow,
    };
    link.push(Kind::QueueOffer, 0, &offer.encode());
    // The other relay waits at most DIRECT_WAIT for its program; its
    // answer then takes a round trip.
    let answer = match take.recv_timeout(DIRECT_WAIT + Duration::from_secs(1)) {
        Ok(Event::Answer(a)) => a,
        Ok(Event::Offer(_)) | Err(_) => {
            d.meet().withdraw(&req.key);
            let _ = settle(None);
            return Err(DirectError::Late("queue answer"));
        }
    };
    let (queue, peer_flow) = match answer {
        QueueAnswer::NoQueue => {
            let _ = settle(None);
            return Err(DirectError::NoQueue);
        }
        QueueAnswer::Agreed { queue, flow } => (queue, flow),
    };
    settle(Some(queue))?;
    let held = HeldQueue {
        queues: Arc::clone(&d.queues),
        queue,
    };
    let made =
        port::make(&d.spares, &hub.iface.name, queue, t.mac, flow).map_err(DirectError::Port)?;
    let grant = DirectGrant {
        queue,
        local_flow: flow,
        peer_flow,
        peer_mac: t.mac,
    };
    Ok((grant, made, held))
}

/// The port itself: made, put in the shared steering and registered
/// (with the xdp feature; without it the relay does not run).
#[cfg(feature = "xdp")]
mod port {
    pub(crate) use crate::spares::Spares;
    use netgap_proto::direct::{DirectGrant, Mac};
    use netgap_transport::xdp::direct::DirectConn;
    use netgap_transport::xdp::handover::{self, HandedPort};
    use netgap_transport::xdp::{ConnId, Registration, Shape, Steering};
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

    /// The pool of spare ports of the direct connections' shape on
    /// `ifname`: one connection's, which the transport's engine on it is
    /// built for (1 MiB of UMEM at a 1500-byte MTU, not the 16 of a
    /// transport port's: the kernel pins every page of it at the port's
    /// making, a cost each connection's setup pays at both ends). An MTU
    /// that cannot be read gets the shape that holds any up to 4082 bytes.
    pub(crate) fn spares(ifname: &str) -> std::sync::Arc<Spares> {
        let shape: Shape = DirectConn::shape_for_interface(ifname).unwrap_or(DirectConn::SHAPE);
        Spares::start(shape)
    }

    /// How long a queue a closed socket still holds is waited for.
    const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

    /// A port made and registered: the port goes to the program, the
    /// registration stays with the relay.
    pub(crate) struct Made {
        pub(crate) port: HandedPort,
        pub(crate) registration: Registration,
    }

    /// Makes the port on `queue` of `ifname`, puts its socket in the
    /// interface's shared steering, and registers the connection (frames
    /// from `peer_mac` to `flow` only).
    pub(crate) fn make(
        spares: &Spares,
        ifname: &str,
        queue: u16,
        peer_mac: Mac,
        flow: u16,
    ) -> io::Result<Made> {
        let steering = Steering::shared(ifname)?;
        let name = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
        // SAFETY: `name` is NUL-terminated and alive for the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel frees a closed socket's hold on its queue a little
        // after the close (deferred work): the socket of the connection
        // that held this queue last may still hold it.
        // A spare, made ahead: only the bind is left, which ties it to
        // the queue.
        let t0 = std::time::Instant::now();
        let mut unbound = spares.take()?;
        let port = loop {
            match unbound.bind(ifindex, u32::from(queue)) {
                Ok(port) => break port,
                Err((u, e))
                    if e.kind() == io::ErrorKind::ResourceBusy && t0.elapsed() < BUSY_WAIT =>
                {
                    unbound = u;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err((_, e)) => return Err(e),
            }
        };
        steering.put_socket(u32::from(queue), port.socket.as_raw_fd())?;
        let registration = steering.register_while(
            u32::from(queue),
            ConnId {
                peer_mac,
                local_flow: flow,
            },
        )?;
        Ok(Made { port, registration })
    }

    /// Sends the grant and the port in one datagram on the client socket.
    pub(crate) fn hand_over(fd: RawFd, grant: &DirectGrant, port: HandedPort) -> io::Result<()> {
        // SAFETY: `fd` is the client socket, open for the whole call
        // (its owner, the serving thread, waits on it).
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        handover::send_after(socket, &grant.encode(), port)
    }
}

/// Without the xdp feature the relay does not run (`run` says so first);
/// these say the same if reached.
#[cfg(not(feature = "xdp"))]
mod port {
    use netgap_proto::direct::{DirectGrant, Mac};
    use std::io;
    use std::os::fd::RawFd;

    /// No port exists without the feature.
    pub(crate) enum NoPort {}

    /// Nothing is made without the feature.
    pub(crate) struct Made {
        pub(crate) port: NoPort,
        pub(crate) registration: NoPort,
    }

    fn no_xdp() -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "this netgap was built without the xdp feature",
        )
    }

    /// No spares without the feature.
    pub(crate) struct Spares;

    pub(crate) fn spares(_ifname: &str) -> std::sync::Arc<Spares> {
        std::sync::Arc::new(Spares)
    }

    pub(crate) fn make(
        _spares: &Spares,
        _ifname: &str,
        _queue: u16,
        _peer_mac: Mac,
        _flow: u16,
    ) -> io::Result<Made> {
        Err(no_xdp())
    }

    pub(crate) fn hand_over(_fd: RawFd, _grant: &DirectGrant, port: NoPort) -> io::Result<()> {
        match port {}
    }
}
