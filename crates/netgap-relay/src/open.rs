//! The two requests a program makes of the relay over the hub: a listen
//! (the accepting side) and a connect, each opening the link when there
//! is none, once the request passed the relay's rules.

use crate::carry::HelloError;
use crate::conn::{AnswerError, Conn, Ends};
use crate::host::{neighbour, socket_facts, SocketError};
use crate::hub::{Hub, HubError};
use crate::link::{Link, Pending};
use crate::policy::{self, LinkId, LinkIdError, Refusal, TargetError, XdpInterface};
use crate::request::{reply, Request};
use crate::ring::FarEnd;
use crate::ring::MapError;
use crate::table::Role;
use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::FlowKey;
use netgap_proto::preload::{RelayReply, RelayRequest};
use netgap_proto::relay::{self as frame};
use netgap_transport::xdp::{parse_addr, Xdp, XdpAddr};
use netgap_transport::{FlowConfig, FlowError, Transport, TransportError};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a program's listen or connect was not carried; the refusal's
/// text is this one line.
#[derive(Debug, Error)]
pub(crate) enum OpenError {
    /// The request's descriptors could not be read.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The relay's rules refuse the request's socket.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The request's region is no region the relay maps.
    #[error(transparent)]
    Region(#[from] MapError),
    /// No duplicate of the TCP socket.
    #[error("keeping the TCP socket: {0}")]
    KeepTcp(std::io::Error),
    /// No duplicate of the client socket.
    #[error("keeping the client socket: {0}")]
    KeepClient(std::io::Error),
    /// No place on the link table.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The listen's wait for the other relay's `OPEN` ran out.
    #[error("no OPEN for the connection from the other relay in time")]
    NoOpen,
    /// The connection went direct: its listen waits no longer.
    #[error("the connection went direct")]
    WentDirect,
    /// The link closed just as an `OPEN` took the listen.
    #[error("the link closed as the connection opened")]
    ClosedOpening,
    /// The link closed while the listen waited.
    #[error("the link closed before the connection opened")]
    ClosedBefore,
    /// No xdp listen for the link.
    #[error("xdp listen: {0}")]
    XdpListen(TransportError),
    /// The xdp listen's own address does not parse.
    #[error("{0}")]
    OwnAddr(netgap_transport::xdp::AddrError),
    /// The request names no link.
    #[error(transparent)]
    LinkId(#[from] LinkIdError),
    /// The other relay's flow did not come.
    #[error("xdp accept: {0}")]
    XdpAccept(TransportError),
    /// The link's flow could not be keyed.
    #[error("keying the link: {0}")]
    Keying(FlowError),
    /// The link's hellos failed.
    #[error(transparent)]
    Hello(#[from] HelloError),
    /// A connect's request was not a connect.
    #[error("not a connect")]
    NotConnect,
    /// A reservation reached the link table.
    #[error("a reservation names no flow")]
    Reservation,
    /// A connect's target does not parse.
    #[error("target {target}: {why}")]
    Target {
        /// The target as the library sent it.
        target: String,
        /// Why it is no `IP/MAC/FLOW`.
        why: netgap_transport::xdp::AddrError,
    },
    /// A connect's target is the TCP connection's own peer.
    #[error("target {0} is the TCP connection's own peer address: the flow would take that interface's frames")]
    OwnPeer(String),
    /// The relay's rules refuse the target.
    #[error(transparent)]
    TargetRefused(#[from] TargetError),
    /// The other relay did not take the connection.
    #[error(transparent)]
    Answer(#[from] AnswerError),
    /// No xdp flow to the target.
    #[error("xdp connect to {target}: {why}")]
    XdpConnect {
        /// The target of the connect.
        target: String,
        /// Why the flow did not open.
        why: TransportError,
    },
}

/// How long a listen waits for the other relay's flow, and then for
/// the other relay's `OPEN` naming its connection.
pub(crate) const ACCEPT_WAIT: Duration = Duration::from_secs(10);

/// How often a listen waiting for the other relay's flow looks whether
/// its connection's `OPEN` came on another link.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// How long a request waits for the link while another request opens
/// or closes it. A connect's reply comes within this, an xdp connect
/// (3 s at most) and `OPEN_WAIT`: the library waits 10 s for it.
pub(crate) const STATE_WAIT: Duration = Duration::from_secs(4);

/// A connection relayed on the link, with the link.
pub(crate) type Opened = (Arc<Conn>, Arc<Link>);

/// Why a request failed, and whether the library already has its
/// reply (then a refusal would only be noise on its doorbell socket).
pub(crate) struct Failed {
    pub(crate) why: OpenError,
    pub(crate) replied: bool,
}

pub(crate) fn before(why: impl Into<OpenError>) -> Failed {
    Failed {
        why: why.into(),
        replied: false,
    }
}

pub(crate) fn after(why: impl Into<OpenError>) -> Failed {
    Failed {
        why: why.into(),
        replied: true,
    }
}

/// The client a request came from: its uid, and how its lines name
/// it.
pub(crate) struct Asker {
    pub(crate) uid: u32,
    pub(crate) who: String,
}

impl Asker {
    /// A line about this client's request, within its uid's share of
    /// the log.
    pub(crate) fn say(&self, hub: &Hub, what: &str) {
        hub.journal
            .client(self.uid, &format!("{}: {what}", self.who));
    }
}

pub(crate) fn ring_of(req: &RelayRequest) -> u32 {
    match req {
        RelayRequest::Listen { ring_bytes, .. }
        | RelayRequest::Reserve { ring_bytes, .. }
        | RelayRequest::Connect { ring_bytes, .. } => *ring_bytes,
    }
}

pub(crate) fn key_of(req: &RelayRequest) -> [u8; frame::KEY_BYTES] {
    match req {
        RelayRequest::Listen { key, .. }
        | RelayRequest::Reserve { key, .. }
        | RelayRequest::Connect { key, .. } => *key,
    }
}

pub(crate) fn flow_config(timeout: Duration) -> FlowConfig {
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
pub(crate) fn take_parts(
    hub: &Hub,
    r: &Request,
    client: &OwnedFd,
    uid: u32,
) -> Result<(Ends, IpAddr, IpAddr), OpenError> {
    let facts = socket_facts(r)?;
    policy::check_socket(uid, &facts, &hub.served, &hub.iface)?;
    let ring = FarEnd::map(r.region.as_raw_fd(), ring_of(&r.req) as usize)?;
    let tcp = r.tcp.try_clone().map_err(OpenError::KeepTcp)?;
    let client = client.try_clone().map_err(OpenError::KeepClient)?;
    Ok((Ends { ring, tcp, client }, facts.local, facts.peer))
}

/// The accepting side: names this relay's end of the link (opening it
/// if it is down) and waits for the other relay's `OPEN` with the
/// connection's key.
pub(crate) fn listen(
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
    match hub
        .enter(tcp_peer, Role::Listen, |_| true, deadline)
        .map_err(before)?
    {
        Some(link) => {
            let name = link.local_name.clone();
            link.touch();
            hub.register(key, pending).map_err(before)?;
            reply(client, &RelayReply::Ok(name));
        }
        None => {
            let opened = open_listening(hub, &r.req, pending, (tcp_local, tcp_peer), client, asker);
            if let Err(f) = opened {
                hub.forget(tcp_peer, Role::Listen);
                return Err(f);
            }
        }
    }
    match take.recv_timeout(ACCEPT_WAIT) {
        Ok(o) => o.ok_or_else(|| after(OpenError::WentDirect)),
        Err(mpsc::RecvTimeoutError::Timeout) if hub.abandon(&key) => Err(after(OpenError::NoOpen)),
        // An OPEN took it meanwhile: its connection is on the way.
        Err(mpsc::RecvTimeoutError::Timeout) => take
            .recv_timeout(Duration::from_secs(1))
            .map_err(|_| after(OpenError::ClosedOpening))?
            .ok_or_else(|| after(OpenError::WentDirect)),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(after(OpenError::ClosedBefore)),
    }
}

/// Opens the link as its accepting side: an xdp listen on the relay's
/// interface, the reply, the other relay's flow keyed from the relay
/// key ([`LinkId::flow_key`]); or none, when the connection's `OPEN`
/// comes first on a link a connect of this relay opened meanwhile.
pub(crate) fn open_listening(
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
        .map_err(|e| before(OpenError::XdpListen(e)))?;
    let name = l.addr();
    let own = parse_addr(&name).map_err(|e| before(OpenError::OwnAddr(e)))?;
    let link_key = LinkId::of_request(req, &own, tcp_local, tcp_peer)
        .map_err(before)?
        .flow_key(&hub.relay_key);
    hub.register(key, pending).map_err(before)?;
    asker.say(
        hub,
        &format!("no link: listening for the other relay's flow at {name} (a connection from {tcp_peer})"),
    );
    reply(client, &RelayReply::Ok(name.clone()));
    let fail = |why: OpenError| {
        hub.abandon(&key);
        after(why)
    };
    let t0 = Instant::now();
    let mut flow = loop {
        match l.accept(ACCEPT_POLL) {
            Ok(flow) => break flow,
            Err(TransportError::AcceptTimeout { transport, .. }) => {
                if !hub.waiting(&key) {
                    // Its OPEN came on a link this relay opened to the
                    // other meanwhile (both listened, then connected to
                    // each other): that link serves, no flow comes here.
                    hub.forget(tcp_peer, Role::Listen);
                    return Ok(());
                }
                if t0.elapsed() >= ACCEPT_WAIT {
                    return Err(fail(OpenError::XdpAccept(TransportError::AcceptTimeout {
                        transport,
                        timeout_ms: ACCEPT_WAIT.as_millis(),
                    })));
                }
            }
            Err(e) => return Err(fail(OpenError::XdpAccept(e))),
        }
    };
    drop(l);
    flow.bind_session(&FlowKey::from_bytes(link_key))
        .map_err(|e| fail(OpenError::Keying(e)))?;
    Link::start(hub, flow, name, (0, own.flow), tcp_peer).map_err(|e| fail(e.into()))?;
    Ok(())
}

/// The connecting side: opens the connection on the link that ends at
/// the target (opening it if there is none), once the target
/// passed the relay's rules ([`policy::check_target`]: on the
/// interface's subnet, at the neighbour table's MAC).
pub(crate) fn connect(
    hub: &Arc<Hub>,
    r: Request,
    client_sock: &OwnedFd,
    asker: &Asker,
) -> Result<Opened, Failed> {
    let RelayRequest::Connect { key, target, .. } = &r.req else {
        return Err(before(OpenError::NotConnect));
    };
    let t = parse_addr(target).map_err(|why| {
        before(OpenError::Target {
            target: target.clone(),
            why,
        })
    })?;
    let (ends, tcp_local, tcp_peer) =
        take_parts(hub, &r, client_sock, asker.uid).map_err(before)?;
    let client = client_sock.as_raw_fd();
    if t.ip == tcp_peer {
        return Err(before(OpenError::OwnPeer(target.clone())));
    }
    policy::check_target(&t, &hub.iface, neighbour(t.ip, &hub.iface.name)).map_err(before)?;
    let own = own_end(&hub.iface, t.flow);
    let link_id = LinkId::of_request(&r.req, &own, tcp_local, tcp_peer).map_err(before)?;
    let mut parts = Some(ends);
    let deadline = Instant::now() + STATE_WAIT;
    // The link that ends at the target; another link to that host (one
    // crossing it, or one the other relay lost) does not serve.
    let fits = |l: &Link| l.peer_ip == t.ip && l.flow_id == t.flow;
    hub.close_stale(tcp_peer, fits);
    loop {
        let up = hub
            .enter(tcp_peer, Role::Connect, fits, deadline)
            .map_err(before)?;
        let link = match up {
            Some(l) => l,
            None => match open_connecting(hub, t, target, &link_id, tcp_peer, asker) {
                Ok(l) => l,
                Err(why) => {
                    hub.forget(tcp_peer, Role::Connect);
                    return Err(before(why));
                }
            },
        };
        match link.open_conn(*key, &mut parts) {
            Ok(conn) => {
                reply(client, &RelayReply::Ok("-".into()));
                return Ok((conn, link));
            }
            Err(None) => {}
            Err(Some(why)) => return Err(before(why)),
        }
        if Instant::now() >= deadline {
            return Err(before(HubError::NotUp));
        }
    }
}

/// Opens the link as its connecting side, keyed from the relay key
/// ([`LinkId::flow_key`]).
pub(crate) fn open_connecting(
    hub: &Arc<Hub>,
    t: XdpAddr,
    target: &str,
    link_id: &LinkId,
    tcp_peer: IpAddr,
    asker: &Asker,
) -> Result<Arc<Link>, OpenError> {
    let mut flow = Xdp
        .connect(&flow_config(hub.timeout), target)
        .map_err(|why| OpenError::XdpConnect {
            target: target.to_string(),
            why,
        })?;
    flow.bind_session(&FlowKey::from_bytes(link_id.flow_key(&hub.relay_key)))
        .map_err(OpenError::Keying)?;
    let name = own_end(&hub.iface, t.flow).to_string();
    asker.say(hub, &format!("no link: connected to {target}"));
    Ok(Link::start(
        hub,
        flow,
        name,
        (frame::CONNECTOR_BIT, t.flow),
        tcp_peer,
    )?)
}

/// This host's end of a link whose flow id is `flow`: the relay's
/// interface's address and MAC.
pub(crate) fn own_end(iface: &XdpInterface, flow: u16) -> XdpAddr {
    XdpAddr {
        ip: IpAddr::V4(iface.ip),
        mac: iface.mac,
        flow,
    }
}
