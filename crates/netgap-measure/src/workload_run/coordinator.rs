//! The workload coordinator: connects to the agent of every host (or starts
//! in-process agents on loopback), places each point's roles where its
//! workload says ([`netgap_workload::Workload::place`]), resolves the
//! addresses they listen on, connect to and leave from, prepares every
//! role, starts all of them with one `group_go` each (the barrier), and
//! gathers the per-flow reports into one
//! [`netgap_core::record::ResultRecord`] per point, handed to the sinks as
//! soon as it is measured.
//!
//! Every session has a reader thread that forwards its replies to one
//! channel, so the coordinator hears at once from a host whose agent dies
//! (its control connection closes) or goes silent (a deadline passes) and
//! names it, whichever host it was waiting on.

mod addresses;
mod rep;

use super::plan::{HostsSource, WorkloadPlan};
use crate::agent::Agent;
use crate::control::{ControlAddr, ControlConn, ControlError, ControlStream};
use crate::handshake::{handshake, LinkError};
use crate::point_loop::SinkError;
pub(super) use addresses::{fix_unspecified, place, retarget};
use netgap_core::host::HostFacts;
use netgap_proto::auth::Key;
use netgap_proto::codec::{decode_reply, encode};
use netgap_proto::message::{Reply, Request};
use netgap_proto::session::CoordinatorSession;
pub(super) use rep::RepResult;
use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A running agent that says nothing for this long (it says it is alive
/// every second) has gone silent.
const SILENCE_LIMIT: Duration = Duration::from_secs(3);
/// How often waiting checks every running host for silence.
const SILENCE_CHECK: Duration = Duration::from_millis(250);
/// How long `bye` waits for the agents to say they have closed.
const BYE_WAIT: Duration = Duration::from_secs(2);
/// How long an agent may take to answer a request that moves no data.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Extra time, past the warm-up, window and drain, for the results.
const RESULT_SLACK: Duration = Duration::from_secs(4);
/// Extra time for the results per flow of the point.
const PER_FLOW_REPORT_TIME: Duration = Duration::from_millis(1);
/// After a first failure, how long to listen for a host whose connection
/// dropped: a dead client host makes the server's flows fail too, and the
/// dead host is the one to name.
const FAILURE_GRACE: Duration = Duration::from_millis(300);

/// Why a workload run failed: one line naming the host when a host failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A host's agent failed, died or went silent.
    #[error("host {host} ({control}) failed: {detail}")]
    Host {
        /// Host name.
        host: String,
        /// Its control address.
        control: String,
        /// What happened.
        detail: String,
    },
    /// A point could not be set up or summarized (not a host's fault).
    #[error("{0}")]
    Point(String),
    /// In-process agents could not start.
    #[error("cannot start the in-process agents: {0}")]
    Embedded(String),
    /// A results file could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The key file is unusable.
    #[error(transparent)]
    Key(#[from] crate::auth::KeyFileError),
    /// Agents of a launcher's nodes that never answered while the run
    /// waited for them: each node, with the last reason.
    #[error("no agent answered within {waited:?} on {} (start them with `srun --ntasks-per-node=1 netgap serve --bind auto`, or wait longer with --wait)", nodes.join(", "))]
    NeverAnswered {
        /// How long the run waited.
        waited: Duration,
        /// Each silent node, `NAME (ADDR: REASON)`.
        nodes: Vec<String>,
    },
}

/// Why a host's control session ended, in the one line a run reports.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum SessionLost {
    /// The agent closed the control connection.
    #[error("the agent closed the control connection (did it die?)")]
    Closed,
    /// The connection broke otherwise: an I/O error, a frame that does not
    /// decode. Shared, as the end is kept for the host and also returned.
    #[error("{0}")]
    Broken(Arc<ControlError>),
}

impl From<ControlError> for SessionLost {
    fn from(e: ControlError) -> SessionLost {
        match e {
            ControlError::Closed => SessionLost::Closed,
            other => SessionLost::Broken(Arc::new(other)),
        }
    }
}

/// One host of the run, resolved.
#[derive(Debug, Clone)]
pub(super) struct HostInfo {
    /// Host name (from the hosts file, else its control address).
    pub(super) name: String,
    control: ControlAddr,
    /// Data address, when known (hosts file, in-process agents).
    pub(super) address: Option<IpAddr>,
    /// Link pairs (local, remote) to the server, for multirail.
    rails: Vec<(IpAddr, IpAddr)>,
    /// On a mesh, the first link (local, remote) to the server: the path
    /// every other test takes, as the server's own address may sit on
    /// another link's subnet.
    pub(super) via: Option<(IpAddr, IpAddr)>,
    /// On a mesh, the first link (peer host name, local, remote) to every
    /// other host: how a role of a staged placement reaches any earlier
    /// role, not only the first host's.
    peer_links: Vec<(String, IpAddr, IpAddr)>,
}

/// One agent session.
pub(super) struct Link {
    pub(super) host: HostInfo,
    writer: ControlStream,
    pub(super) session: CoordinatorSession,
    /// The agent's host facts, from its welcome.
    pub(super) facts: HostFacts,
    pending: VecDeque<Reply>,
}

type Event = (usize, Result<Reply, ControlError>);

impl HostInfo {
    /// The error naming this host.
    fn error(&self, detail: String) -> WorkloadError {
        WorkloadError::Host {
            host: self.name.clone(),
            control: self.control.to_string(),
            detail,
        }
    }
}

impl Link {
    /// The session of host `i` over the handshaken `link`, its replies read
    /// by a thread of its own into `tx`.
    fn start(
        i: usize,
        host: HostInfo,
        link: crate::handshake::AgentLink,
        tx: mpsc::Sender<Event>,
    ) -> Result<Link, WorkloadError> {
        let writer = link
            .conn
            .try_clone_stream()
            .map_err(|e| host.error(e.to_string()))?;
        let conn = link.conn;
        std::thread::Builder::new()
            .name(format!("control {}", host.name))
            .spawn(move || read_replies(i, conn, tx))
            .map_err(|e| host.error(format!("cannot start a reader thread: {e}")))?;
        Ok(Link {
            host,
            writer,
            session: link.session,
            facts: link.peer_host,
            pending: VecDeque::new(),
        })
    }
}

/// The failure of a handshake, named by `fail`.
fn link_failure(e: LinkError, fail: &dyn Fn(String) -> WorkloadError) -> WorkloadError {
    match e {
        LinkError::KeyRequired => fail(format!("{e} (or a hosts file whose key_file names it)")),
        e => fail(e.to_string()),
    }
}

/// Whether an agent that refused a connection this way may still be
/// starting: nothing listens yet, or its node is not reachable yet.
fn may_be_starting(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused
            | K::ConnectionReset
            | K::TimedOut
            | K::WouldBlock
            | K::HostUnreachable
            | K::NetworkUnreachable
    )
}

/// How often a run asks agents that are not listening yet.
const WAIT_RETRY: Duration = Duration::from_millis(100);

/// Shakes hands with every host's agent, asking again those not listening
/// yet until all answered or `wait` passed: the sessions, in host order,
/// or every node that never answered, named in one error.
fn wait_for_agents(
    hosts: &[HostInfo],
    key: Option<&Key>,
    wait: Duration,
) -> Result<Vec<Option<crate::handshake::AgentLink>>, WorkloadError> {
    let deadline = Instant::now() + wait;
    let mut links: Vec<Option<crate::handshake::AgentLink>> = hosts.iter().map(|_| None).collect();
    let mut why: Vec<String> = vec![String::new(); hosts.len()];
    loop {
        // Every node still silent is asked at once, so a round takes one
        // connect timeout however many nodes are unreachable.
        let round: Vec<(usize, Result<crate::handshake::AgentLink, LinkError>)> =
            std::thread::scope(|scope| {
                let asks: Vec<_> = hosts
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| links[*i].is_none())
                    .map(|(i, host)| (i, scope.spawn(move || handshake(&host.control, key))))
                    .collect();
                asks.into_iter()
                    .map(|(i, t)| {
                        let r = t.join().unwrap_or_else(|_| {
                            Err(LinkError::Connect(std::io::Error::other(
                                "the handshake thread panicked",
                            )))
                        });
                        (i, r)
                    })
                    .collect()
            });
        for (i, r) in round {
            match r {
                Ok(link) => links[i] = Some(link),
                Err(LinkError::Connect(e)) if may_be_starting(&e) => why[i] = e.to_string(),
                Err(e) => {
                    let host = &hosts[i];
                    return Err(link_failure(e, &|detail| host.error(detail)));
                }
            }
        }
        if links.iter().all(Option::is_some) {
            return Ok(links);
        }
        if Instant::now() >= deadline {
            let nodes = hosts
                .iter()
                .zip(&links)
                .zip(&why)
                .filter(|((_, l), _)| l.is_none())
                .map(|((h, _), w)| format!("{} ({}: {w})", h.name, h.control))
                .collect();
            return Err(WorkloadError::NeverAnswered {
                waited: wait,
                nodes,
            });
        }
        std::thread::sleep(WAIT_RETRY.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// Sessions with every host of a run.
pub struct WorkloadCoordinator {
    /// Sessions: the server's first, then the client hosts'.
    pub(super) links: Vec<Link>,
    events: mpsc::Receiver<Event>,
    lost: Vec<Option<SessionLost>>,
    /// Hosts running a workload role, with when each was last heard from.
    running: Vec<Option<Instant>>,
    /// Hosts preparing a workload role (between `group_prepare` and
    /// `group_ready`), with when each was last heard from or asked.
    setup: Vec<Option<Instant>>,
    /// How long a preparing host may say nothing: the point's I/O timeout,
    /// at least two alive intervals. Agents of this protocol version say
    /// they are alive every second while preparing, so a longer silence is
    /// a silent host, not a slow setup.
    setup_limit: Duration,
    /// Facts of this (the coordinator's) host.
    pub(super) local: HostFacts,
    /// The hosts the current repetition places a role on: the end of any
    /// other host's session fails nothing now (an agent ends a session it
    /// heard nothing on for its idle time, as a host no point used for a
    /// while), and the session is opened again when a point needs it.
    active: Vec<bool>,
    /// The key the sessions were opened with, for opening them again.
    key: Option<Key>,
    /// Where every session's reader sends its replies.
    tx: mpsc::Sender<Event>,
}

fn resolve_hosts(source: &HostsSource) -> Result<Vec<HostInfo>, WorkloadError> {
    match source {
        HostsSource::File(f) => {
            let server = &f.hosts[0];
            f.hosts
                .iter()
                .map(|h| {
                    let control = h.control_addr().ok_or_else(|| {
                        WorkloadError::Point(format!("host {}: bad control address", h.name))
                    })?;
                    let rails: Vec<(IpAddr, IpAddr)> = h
                        .links_to(&server.name)
                        .map(|l| (l.local, l.remote))
                        .collect();
                    let mut peer_links: Vec<(String, IpAddr, IpAddr)> = Vec::new();
                    for l in &h.links {
                        if !peer_links.iter().any(|p| p.0 == l.peer) {
                            peer_links.push((l.peer.clone(), l.local, l.remote));
                        }
                    }
                    Ok(HostInfo {
                        name: h.name.clone(),
                        control,
                        address: Some(h.address),
                        via: rails.first().copied(),
                        rails,
                        peer_links,
                    })
                })
                .collect()
        }
        HostsSource::Addrs(addrs) => Ok(addrs
            .iter()
            .map(|a| HostInfo {
                name: a.to_string(),
                control: a.clone(),
                address: match a {
                    ControlAddr::Tcp(sa) => Some(sa.ip()),
                    ControlAddr::Unix(_) => None,
                },
                rails: Vec::new(),
                via: None,
                peer_links: Vec::new(),
            })
            .collect()),
        HostsSource::Nodes { nodes, .. } => Ok(nodes
            .iter()
            .map(|n| HostInfo {
                name: n.name.clone(),
                control: ControlAddr::Tcp(n.control),
                address: Some(n.control.ip()),
                rails: Vec::new(),
                via: None,
                peer_links: Vec::new(),
            })
            .collect()),
        HostsSource::Embedded {
            client_hosts,
            links,
        } => {
            let mut hosts = Vec::new();
            for h in 0..=*client_hosts {
                let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + h as u8));
                // The user runs these agents in this very process, so the
                // servers a workload starts are this process's own children.
                let agent = Agent::bind(SocketAddr::new(ip, 0))
                    .map_err(|e| WorkloadError::Embedded(e.to_string()))?
                    .allow_services()
                    .quiet();
                let addr = agent
                    .local_addr()
                    .map_err(|e| WorkloadError::Embedded(e.to_string()))?;
                agent
                    .spawn()
                    .map_err(|e| WorkloadError::Embedded(e.to_string()))?;
                // Loopback links: distinct address pairs 127.0.1.k (client
                // side) and 127.0.2.k (server side).
                let rails = if h == 1 {
                    (1..=*links as u8)
                        .map(|k| {
                            (
                                IpAddr::V4(Ipv4Addr::new(127, 0, 1, k)),
                                IpAddr::V4(Ipv4Addr::new(127, 0, 2, k)),
                            )
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                hosts.push(HostInfo {
                    name: ip.to_string(),
                    control: ControlAddr::Tcp(addr),
                    address: Some(ip),
                    rails,
                    via: None,
                    peer_links: Vec::new(),
                });
            }
            Ok(hosts)
        }
    }
}

/// A coordinator dropped without `WorkloadCoordinator::bye` (a failed
/// point) shuts its control connections down: each reader thread holds a
/// clone of its connection and would otherwise keep the session open, and
/// the agent busy, for as long as this process lives (a `netgap study`
/// that measures figure after figure).
impl Drop for WorkloadCoordinator {
    fn drop(&mut self) {
        for link in &self.links {
            let _ = link.writer.shutdown();
        }
    }
}

impl WorkloadCoordinator {
    /// Connects to every host's agent, proves `key` to it when given (see
    /// [`crate::auth::prove`]) and shakes hands. With `wait`, agents that
    /// are not listening yet (a launcher still starting them) are asked
    /// again until every one answers or `wait` has passed.
    fn connect(
        hosts: Vec<HostInfo>,
        key: Option<&Key>,
        wait: Option<Duration>,
    ) -> Result<WorkloadCoordinator, WorkloadError> {
        let (tx, rx) = mpsc::channel();
        let mut links = Vec::new();
        let mut local_ip = None;
        let mut early = match wait {
            Some(w) => wait_for_agents(&hosts, key, w)?,
            None => hosts.iter().map(|_| None).collect(),
        };
        for (i, host) in hosts.into_iter().enumerate() {
            let link = match early[i].take() {
                Some(link) => link,
                None => handshake(&host.control, key)
                    .map_err(|e| link_failure(e, &|detail| host.error(detail)))?,
            };
            local_ip = local_ip.or(link.local_ip);
            links.push(Link::start(i, host, link, tx.clone())?);
        }
        let lost = vec![None; links.len()];
        Ok(WorkloadCoordinator {
            running: vec![None; links.len()],
            setup: vec![None; links.len()],
            setup_limit: SILENCE_LIMIT,
            active: vec![true; links.len()],
            key: key.cloned(),
            tx,
            links,
            events: rx,
            lost,
            local: netgap_transport::host::collect(local_ip),
        })
    }

    /// Takes the replies and session ends already reported, without
    /// waiting: a reply is kept for its host, an end recorded.
    fn take_reported(&mut self) {
        while let Ok((j, ev)) = self.events.try_recv() {
            match ev {
                Ok(r) => self.links[j].pending.push_back(r),
                Err(e) => self.lost[j] = Some(e.into()),
            }
        }
    }

    /// Makes `hosts` the ones the coordinator now needs, opening a fresh
    /// session with each of them whose session ended while no point used
    /// it (its agent's idle time passed). Its reader had stopped with the
    /// end it reported, so nothing of the old session reaches the new one.
    pub(super) fn use_hosts(&mut self, hosts: &[usize]) -> Result<(), WorkloadError> {
        self.take_reported();
        for (i, a) in self.active.iter_mut().enumerate() {
            *a = hosts.contains(&i);
        }
        for &i in hosts {
            if self.lost[i].is_none() {
                continue;
            }
            let host = self.links[i].host.clone();
            let link = handshake(&host.control, self.key.as_ref())
                .map_err(|e| link_failure(e, &|detail| host.error(detail)))?;
            self.links[i] = Link::start(i, host, link, self.tx.clone())?;
            self.lost[i] = None;
            self.running[i] = None;
            self.setup[i] = None;
        }
        Ok(())
    }

    /// The error naming host `i`.
    pub(super) fn host_error(&self, i: usize, detail: String) -> WorkloadError {
        self.links[i].host.error(detail)
    }

    pub(super) fn send(&mut self, i: usize, req: &Request) -> Result<(), WorkloadError> {
        let frame = encode(req).map_err(|e| WorkloadError::Point(e.to_string()))?;
        let w = &mut self.links[i].writer;
        let r = match w {
            ControlStream::Tcp(s) => s.set_write_timeout(Some(REPLY_TIMEOUT)),
            ControlStream::Unix(s) => s.set_write_timeout(Some(REPLY_TIMEOUT)),
        }
        .and_then(|()| w.write_all(&frame));
        r.map_err(|e| {
            self.host_error(
                i,
                format!("sending {}: {e} (did its agent die?)", req.kind()),
            )
        })
    }

    /// The failure to report once host `i` failed with `detail`: after a
    /// short grace, a host whose connection dropped is named first.
    fn failure(&mut self, i: usize, detail: String) -> WorkloadError {
        let until = Instant::now() + FAILURE_GRACE;
        while let Ok((j, ev)) = self
            .events
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            if let Err(e) = ev {
                self.lost[j] = Some(e.into());
            }
        }
        if let Some(j) = (0..self.lost.len()).find(|&j| self.active[j] && self.lost[j].is_some()) {
            let d = self.lost[j]
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            return self.host_error(j, d);
        }
        // A stopped host stalls its peers' flows, which then fail too:
        // name the host that stopped answering, not the one that noticed.
        let quiet = 2 * netgap_proto::message::WORKLOAD_ALIVE_INTERVAL;
        if let Some(j) = self
            .running
            .iter()
            .position(|t| t.is_some_and(|t| t.elapsed() > quiet))
            .filter(|&j| j != i || !detail.starts_with("agent error"))
        {
            let since = self.running[j].map(|t| t.elapsed()).unwrap_or_default();
            return self.host_error(
                j,
                format!("its agent went silent (nothing heard for {since:.1?} while running)"),
            );
        }
        self.host_error(i, detail)
    }

    /// The next reply of host `i`, within `timeout`. A failure of any
    /// other host seen meanwhile fails at once, naming that host.
    pub(super) fn wait(&mut self, i: usize, timeout: Duration) -> Result<Reply, WorkloadError> {
        if let Some(r) = self.links[i].pending.pop_front() {
            return Ok(r);
        }
        if let Some(e) = self.lost[i].clone() {
            return Err(self.failure(i, e.to_string()));
        }
        let mut deadline = Instant::now() + timeout;
        loop {
            if let Some(j) = self.silent_host() {
                return Err(self.failure(
                    j,
                    format!(
                        "its agent went silent (nothing heard for {SILENCE_LIMIT:?} while running)"
                    ),
                ));
            }
            if let Some(j) = self.silent_in_setup() {
                return Err(self.failure(
                    j,
                    format!(
                        "its agent went silent during flow setup (nothing heard for {:?})",
                        self.setup_limit
                    ),
                ));
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(SILENCE_CHECK);
            if left.is_zero() {
                return Err(self.failure(
                    i,
                    format!("its agent went silent (no answer within {timeout:?})"),
                ));
            }
            let event = self.events.recv_timeout(left);
            match &event {
                // A host whose role is ready (or failed) has nothing more to
                // say until it runs, though its reply may wait in `pending`
                // while an earlier host is waited for.
                Ok((j, Ok(Reply::WorkloadReady | Reply::Error { .. }))) => self.setup[*j] = None,
                Ok((j, Ok(_))) => {
                    if let Some(t) = self.setup[*j].as_mut() {
                        *t = Instant::now();
                    }
                }
                _ => {}
            }
            // An agent preparing its role says it is alive: liveness only,
            // not a reply the session expects.
            if let Ok((j, Ok(Reply::WorkloadAlive))) = &event {
                if self.running[*j].is_none() && self.setup[*j].is_some() {
                    // The host waited on is still at work (a server
                    // writing its files, a real server starting): its
                    // answer is not late while it says so.
                    if *j == i {
                        deadline = Instant::now() + timeout;
                    }
                    continue;
                }
            }
            match &event {
                // Done running: nothing more is due from it this repetition.
                Ok((j, Ok(Reply::WorkloadFinished { .. }))) => self.running[*j] = None,
                Ok((j, Ok(_))) => {
                    if let Some(t) = self.running[*j].as_mut() {
                        *t = Instant::now();
                    }
                }
                _ => {}
            }
            match event {
                Ok((j, Ok(r))) if j == i => return Ok(r),
                Ok((j, Ok(Reply::Error { message }))) => {
                    return Err(self.failure(j, format!("agent error: {message}")))
                }
                Ok((j, Ok(r))) => self.links[j].pending.push_back(r),
                // A host this repetition does not use: its session is
                // opened again when a point needs it.
                Ok((j, Err(e))) if !self.active[j] => self.lost[j] = Some(e.into()),
                Ok((j, Err(e))) => {
                    let lost = SessionLost::from(e);
                    self.lost[j] = Some(lost.clone());
                    return Err(self.failure(j, lost.to_string()));
                }
                Err(_) => {}
            }
        }
    }

    /// The next word of any of `hosts` within `within`, without judging
    /// it: a reply already kept for one of them first, else the next one
    /// reported (`Err` with the detail when its session ended). `None`
    /// when none of them said anything in time. Replies of other hosts are
    /// kept for them, and the ends of their sessions recorded.
    pub(super) fn next_from(
        &mut self,
        hosts: &[usize],
        within: Duration,
    ) -> Option<(usize, Result<Reply, SessionLost>)> {
        for &i in hosts {
            if let Some(r) = self.links.get_mut(i)?.pending.pop_front() {
                return Some((i, Ok(r)));
            }
            if let Some(e) = self.lost.get(i)?.clone() {
                return Some((i, Err(e)));
            }
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.events.recv_timeout(left) {
                Ok((j, Ok(r))) if hosts.contains(&j) => return Some((j, Ok(r))),
                Ok((j, Ok(r))) => self.links[j].pending.push_back(r),
                Ok((j, Err(e))) => {
                    let lost = SessionLost::from(e);
                    self.lost[j] = Some(lost.clone());
                    if hosts.contains(&j) {
                        return Some((j, Err(lost)));
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// A host running a workload role that has said nothing for longer than
    /// [`SILENCE_LIMIT`], if any.
    fn silent_host(&self) -> Option<usize> {
        first_silent(&self.running, SILENCE_LIMIT)
    }

    /// A host preparing a workload role that has said nothing for longer than
    /// [`WorkloadCoordinator::setup_limit`].
    fn silent_in_setup(&self) -> Option<usize> {
        first_silent(&self.setup, self.setup_limit)
    }

    /// Ends every session politely and waits, up to [`BYE_WAIT`], for each
    /// agent to say it has closed: an agent answers only once nothing of
    /// the session runs, so a run started right after this one finds its
    /// agents free instead of busy.
    pub(crate) fn bye(mut self) {
        let mut open: Vec<bool> = (0..self.links.len())
            .map(|i| {
                let bye = self.links[i].session.bye();
                self.lost[i].is_none() && self.send(i, &bye).is_ok()
            })
            .collect();
        let deadline = Instant::now() + BYE_WAIT;
        while open.iter().any(|&o| o) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                // Its answer, or the connection's end: this session is over.
                Ok((i, Ok(Reply::Closed) | Err(_))) => {
                    if let Some(o) = open.get_mut(i) {
                        *o = false;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}

/// The first host whose last word (`None`: none is due) is older than
/// `limit`.
fn first_silent(last_heard: &[Option<Instant>], limit: Duration) -> Option<usize> {
    last_heard
        .iter()
        .position(|t| t.is_some_and(|t| t.elapsed() > limit))
}

/// Forwards every reply of one session to the coordinator until the
/// connection ends.
fn read_replies(i: usize, mut conn: ControlConn, tx: mpsc::Sender<Event>) {
    loop {
        match conn.recv_payload(Duration::from_secs(3600)) {
            Ok(payload) => {
                let ev = decode_reply(&payload).map_err(ControlError::Codec);
                let stop = ev.is_err();
                if tx.send((i, ev)).is_err() || stop {
                    return;
                }
            }
            Err(ControlError::TimedOut(_)) => continue,
            Err(e) => {
                let _ = tx.send((i, Err(e)));
                return;
            }
        }
    }
}

/// The key to prove to every agent: `--key FILE`, else the hosts file's
/// `key_file` (a testbed names its own key there), else none.
fn run_key(plan: &WorkloadPlan) -> Result<Option<Key>, WorkloadError> {
    let path = plan
        .settings
        .key_file
        .clone()
        .or_else(|| match &plan.hosts {
            HostsSource::File(f) => f.key_file.clone(),
            _ => None,
        });
    Ok(path.map(|p| crate::auth::load_key(&p)).transpose()?)
}

/// Connects to every host of `plan` with the run's key: the sessions a
/// workload run measures through.
pub fn open(plan: &WorkloadPlan) -> Result<WorkloadCoordinator, WorkloadError> {
    let key = run_key(plan)?;
    open_hosts(&plan.hosts, key.as_ref(), plan.settings.io_timeout_ms)
}

/// Connects to every host of `hosts`, proving `key` to each agent when
/// given. A launcher's agents may still be starting: the connection waits
/// for them up to its `--wait`, else `io_timeout_ms`.
pub(crate) fn open_hosts(
    hosts: &HostsSource,
    key: Option<&Key>,
    io_timeout_ms: u32,
) -> Result<WorkloadCoordinator, WorkloadError> {
    let resolved = resolve_hosts(hosts)?;
    let wait = match hosts {
        HostsSource::Nodes { wait, .. } => {
            Some(wait.unwrap_or(Duration::from_millis(u64::from(io_timeout_ms))))
        }
        _ => None,
    };
    WorkloadCoordinator::connect(resolved, key, wait)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn the_first_host_silent_past_the_limit_is_named_and_idle_hosts_never_are() {
        let now = Instant::now();
        let ago = |s| Some(now.checked_sub(Duration::from_secs(s)).unwrap());
        let limit = Duration::from_secs(3);
        assert_eq!(first_silent(&[None, ago(1), None], limit), None);
        assert_eq!(
            first_silent(&[None, ago(1), ago(4), ago(5)], limit),
            Some(2)
        );
        assert_eq!(first_silent(&[], limit), None);
    }
}
