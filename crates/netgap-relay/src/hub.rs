//! The link table: the relay's link to each other host (none, opening,
//! up) and the listens waiting for the other relay's `OPEN`; and the two
//! requests that use it, a listen (the accepting side) and a connect,
//! each opening the link when there is none.

use crate::conn::Conn;
use crate::host::{neighbour, reset_tcp, socket_facts};
use crate::journal::Journal;
use crate::link::Link;
use crate::policy::{self, LinkId, XdpInterface};
use crate::ring::FarEnd;
use crate::server::{reply, Request};
use crate::table::{LinkTable, Step};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::FlowKey;
use netgap_proto::preload::{RelayReply, RelayRequest};
use netgap_proto::relay::{self as frame};
use netgap_transport::xdp::{parse_addr, Xdp, XdpAddr};
use netgap_transport::{FlowConfig, Transport};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a listen waits for the other relay's flow, and then for
/// the other relay's `OPEN` naming its connection.
pub(crate) const ACCEPT_WAIT: Duration = Duration::from_secs(10);

/// How long a request waits for the link while another request opens
/// or closes it. A connect's reply comes within this, an xdp connect
/// (3 s at most) and `OPEN_WAIT`: the library waits 10 s for it.
pub(crate) const STATE_WAIT: Duration = Duration::from_secs(4);

/// What the relay holds of one program's connection: the ring, a
/// duplicate of its TCP socket, and a duplicate of the client socket
/// (to wake the program on this host; see `netgap_shm::wait::WAIT_BELL`).
pub(crate) struct Ends {
    pub(crate) ring: FarEnd,
    pub(crate) tcp: OwnedFd,
    pub(crate) client: OwnedFd,
}

/// A listen waiting for the other relay's `OPEN` with its key.
pub(crate) struct Pending {
    pub(crate) ends: Ends,
    pub(crate) give: mpsc::SyncSender<(Arc<Conn>, Arc<Link>)>,
}

/// The relay's links and the listens waiting for their connection,
/// and what it was started for.
pub(crate) struct Hub {
    pub(crate) links: Mutex<LinkTable<Link>>,
    pub(crate) cv: Condvar,
    pub(crate) pending: Mutex<HashMap<[u8; frame::KEY_BYTES], Pending>>,
    pub(crate) timeout: Duration,
    /// The interface of its flows (`--interface`).
    pub(crate) iface: XdpInterface,
    /// The hosts it serves (`--peers`).
    pub(crate) served: policy::Served,
    /// The relays' key (`--key`): every link's key derives from it.
    pub(crate) relay_key: netgap_proto::auth::Key,
    pub(crate) journal: Arc<Journal>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, LinkTable<Link>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link to `peer` to use (Some), or the caller's claim to open
    /// it (None), waiting until `deadline` while another request opens
    /// it or it closes.
    pub(crate) fn enter(
        &self,
        peer: IpAddr,
        deadline: Instant,
    ) -> Result<Option<Arc<Link>>, String> {
        let mut t = self.lock();
        loop {
            match t.enter(peer).map_err(|e| e.to_string())? {
                Step::Use(link) => return Ok(Some(link)),
                Step::Open => return Ok(None),
                Step::Wait => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err("the link did not come up in time".into());
                    }
                    t = self
                        .cv
                        .wait_timeout(t, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// The link to `peer`, which the caller claimed, is up.
    pub(crate) fn up(&self, peer: IpAddr, link: Arc<Link>) {
        self.lock().up(peer, link);
        self.cv.notify_all();
    }

    /// The caller's claim on `peer` is given back: opening its link
    /// failed.
    pub(crate) fn forget(&self, peer: IpAddr) {
        self.lock().forget(peer);
        self.cv.notify_all();
    }

    /// `link`'s threads ended: its entry goes (unless a newer link to
    /// `peer` took it).
    pub(crate) fn gone(&self, peer: IpAddr, link: &Arc<Link>) {
        self.lock().gone(peer, link);
        self.cv.notify_all();
    }

    pub(crate) fn pending(&self) -> MutexGuard<'_, HashMap<[u8; frame::KEY_BYTES], Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a listen's connection until the `OPEN` with its key.
    pub(crate) fn register(&self, key: [u8; frame::KEY_BYTES], p: Pending) -> Result<(), String> {
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
    pub(crate) fn abandon(&self, key: &[u8; frame::KEY_BYTES]) -> bool {
        let Some(p) = self.pending().remove(key) else {
            return false;
        };
        reset_tcp(p.ends.tcp.as_raw_fd());
        p.ends.ring.closing();
        true
    }
}

/// A connection relayed on the link, with the link.
pub(crate) type Opened = (Arc<Conn>, Arc<Link>);

/// Why a request failed, and whether the library already has its
/// reply (then a refusal would only be noise on its doorbell socket).
pub(crate) struct Failed {
    pub(crate) why: String,
    pub(crate) replied: bool,
}

pub(crate) fn before(why: String) -> Failed {
    Failed {
        why,
        replied: false,
    }
}

pub(crate) fn after(why: String) -> Failed {
    Failed { why, replied: true }
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
    match hub.enter(tcp_peer, deadline).map_err(before)? {
        Some(link) => {
            let name = link.local_name.clone();
            link.touch();
            hub.register(key, pending).map_err(before)?;
            reply(client, &RelayReply::Ok(name));
        }
        None => {
            let opened = open_listening(hub, &r.req, pending, (tcp_local, tcp_peer), client, asker);
            if let Err(f) = opened {
                hub.forget(tcp_peer);
                return Err(f);
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
        .map_err(|e| before(format!("xdp listen: {e}")))?;
    let name = l.addr();
    let own = parse_addr(&name).map_err(|e| before(e.to_string()))?;
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
pub(crate) fn connect(
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
    loop {
        let up = hub.enter(tcp_peer, deadline).map_err(before)?;
        let link = match up {
            Some(l) => l,
            None => match open_connecting(hub, t, target, &link_id, tcp_peer, asker) {
                Ok(l) => l,
                Err(why) => {
                    hub.forget(tcp_peer);
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
            return Err(before("the link did not come up in time".into()));
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
pub(crate) fn own_end(iface: &XdpInterface, flow: u16) -> XdpAddr {
    XdpAddr {
        ip: IpAddr::V4(iface.ip),
        mac: iface.mac,
        flow,
    }
}
