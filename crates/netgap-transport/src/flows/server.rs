//! The server side of the flow engine: `workers` threads, each with its
//! own epoll instance and its own listening socket on the one port
//! (SO_REUSEPORT), so the kernel spreads incoming connections evenly over
//! the workers by their addresses, and each worker accepts and keeps its
//! flows for their whole life without sharing anything with the others.
//! On a datagram path each worker has a UDP socket on the one port instead
//! and answers every flow the kernel steers to it (module `datagram`).
//!
//! A worker's flows read into and send from the worker's buffers
//! ([`WorkerBuffers`]); only an echo the socket held back gets a buffer of
//! its flow's own.

use super::buffers::{BufferGauge, Side, WorkerBuffers};
use super::datagram;
use super::io::{Io, WorkerIo};
use super::machine::{Progress, ServerMachine};
use super::proof::ListenerHandshake;
use super::{limits, EngineConfig, EngineError, FlowWork, ServerTotals};
#[cfg(doc)]
use crate::rto::RETRY_MAX;
use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::DataToken;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The epoll token of the listener; flows use their slot number.
const LISTENER: u64 = u64::MAX;
/// How long a worker sleeps in epoll before looking at the stop flag, ms.
const STOP_POLL_MS: u16 = 50;
/// Connections one worker accepts per wake-up before serving its flows, so
/// a burst of connects does not starve the flows it already has.
const ACCEPT_BATCH: usize = 64;
/// How long a stopped worker keeps serving the exchanges under way (it
/// accepts nothing more) before it closes what is left.
const STOP_DRAIN: Duration = Duration::from_millis(100);
/// How often a worker looks for connections past their proof deadline.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// The listen backlog asked for (the kernel caps it at net.core.somaxconn):
/// thousands of flows connect in a burst.
const BACKLOG: i32 = 4096;

/// Accepts and serves any number of flows on one listener with
/// `cfg.workers` epoll threads, until [`FlowServer::stop`].
#[derive(Debug)]
pub struct FlowServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections open now, all workers together.
    open: Arc<AtomicUsize>,
    /// Connections accepted so far, all workers together.
    accepted: Arc<AtomicU64>,
    /// Datagrams read so far, all workers together (a datagram path's).
    received: Arc<AtomicU64>,
    /// The longest its clients may send it nothing while still at work.
    client_silence: Duration,
    /// What the workers' message buffers hold, and held at most.
    gauge: Arc<BufferGauge>,
    workers: Vec<Worker>,
}

struct Conn {
    stream: TcpStream,
    /// The session proof, until the connector has given it (runs with a
    /// token only), and by when it must be given; the machine sees no byte
    /// before.
    proof: Option<(Box<ListenerHandshake>, Instant)>,
    machine: Box<dyn ServerMachine>,
    interest: EpollFlags,
}

/// What every worker of a server shares.
#[derive(Clone)]
struct Ctx {
    transport: &'static str,
    work: FlowWork,
    mode: Mode,
    options: TransportOptions,
    token: Option<DataToken>,
    open: Arc<AtomicUsize>,
    accepted: Arc<AtomicU64>,
    /// Most connections open at once, all workers together; at it, the
    /// workers stop accepting until one closes.
    max_open: usize,
    /// How long a connection may take to prove the session.
    io_timeout: Duration,
    /// The budget every byte the workers move is charged to, if paced.
    rate: Option<Arc<crate::rate::RateBudget>>,
}

impl FlowServer {
    /// Binds `addr` (port 0 picks a free port) and starts the workers.
    /// Raises the soft descriptor limit to the hard limit, since how many
    /// flows will arrive is up to the clients.
    pub fn bind(
        addr: SocketAddr,
        work: FlowWork,
        cfg: EngineConfig,
    ) -> Result<FlowServer, EngineError> {
        Self::bind_for(addr, work, cfg, None)
    }

    /// [`FlowServer::bind`] for `flows` flows when known: on a datagram
    /// path without `--rcvbuf`, each worker's socket gets a receive queue
    /// that holds a request of each of its flows at once, past
    /// `net.core.rmem_max` where this process may (the connections of a
    /// stream path queue in their own sockets, and its listen backlog is
    /// sized for thousands of connects already).
    pub fn bind_for(
        addr: SocketAddr,
        work: FlowWork,
        cfg: EngineConfig,
        flows: Option<usize>,
    ) -> Result<FlowServer, EngineError> {
        work.validate(cfg.path)?;
        cfg.validate()?;
        raise_fd_limit();
        if cfg.path.datagrams() {
            return bind_datagrams(addr, work, &cfg, flows);
        }
        let first = listen(addr, &cfg.options, cfg.path.name())
            .map_err(|source| EngineError::Bind { addr, source })?;
        let local_addr = first
            .local_addr()
            .map_err(|source| EngineError::Bind { addr, source })?;
        let mut listeners = vec![first];
        for _ in 1..cfg.workers {
            listeners.push(listen(local_addr, &cfg.options, cfg.path.name()).map_err(
                |source| EngineError::Bind {
                    addr: local_addr,
                    source,
                },
            )?);
        }
        start(local_addr, listeners, work, &cfg, usize::MAX)
    }

    /// Serves on a listener bound elsewhere (by the parent of a server
    /// spread over processes, which passed it down), every worker accepting
    /// from it, and holds at most `max_open` connections open at once:
    /// at that cap its workers stop accepting until one closes, so other
    /// processes on the same listener take the rest. The descriptor limit
    /// is raised as in [`FlowServer::bind`]; a datagram path is refused
    /// (its flows hold no descriptors, so it never needs more processes).
    pub fn on_listener(
        listener: TcpListener,
        work: FlowWork,
        cfg: EngineConfig,
        max_open: usize,
    ) -> Result<FlowServer, EngineError> {
        work.validate(cfg.path)?;
        cfg.validate()?;
        if cfg.path.datagrams() {
            return Err(EngineError::Invalid(format!(
                "{} flows hold no descriptors and are served from one process",
                cfg.path.name()
            )));
        }
        if max_open == 0 {
            return Err(EngineError::Invalid(
                "a flow server must hold at least 1 connection".into(),
            ));
        }
        raise_fd_limit();
        let local_addr = listener.local_addr().map_err(|source| EngineError::Sys {
            what: "reading the inherited listener's address".into(),
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| EngineError::Sys {
                what: "making the inherited listener non-blocking".into(),
                source,
            })?;
        let mut listeners = Vec::with_capacity(cfg.workers);
        for _ in 1..cfg.workers {
            listeners.push(listener.try_clone().map_err(|source| EngineError::Sys {
                what: "sharing the listener with a worker".into(),
                source,
            })?);
        }
        listeners.push(listener);
        start(local_addr, listeners, work, &cfg, max_open)
    }
}

/// Starts a worker per listener (each its own socket on the port, or each a
/// handle of one shared socket), holding at most `max_open` connections.
fn start(
    local_addr: SocketAddr,
    listeners: Vec<TcpListener>,
    work: FlowWork,
    cfg: &EngineConfig,
    max_open: usize,
) -> Result<FlowServer, EngineError> {
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let gauge = Arc::new(BufferGauge::default());
    let mut workers = Vec::with_capacity(cfg.workers);
    let ctx = Ctx {
        max_open,
        open: Arc::clone(&open),
        accepted: Arc::clone(&accepted),
        transport: cfg.path.name(),
        work,
        mode: cfg.mode,
        options: cfg.options.clone(),
        token: cfg.token.clone(),
        io_timeout: cfg.io_timeout,
        rate: cfg.rate.clone(),
    };
    for (w, listener) in listeners.into_iter().enumerate() {
        let io = super::io::worker_io(cfg).map_err(|source| EngineError::Sys {
            what: format!("setting up the {} data path of a worker", cfg.path.name()),
            source,
        })?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| sys("creating an epoll instance", e))?;
        epoll
            .add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))
            .map_err(|e| sys("adding the listener to epoll", e))?;
        let bufs = super::buffers::for_worker(work, Side::Server, cfg, &gauge)?;
        let stop_flag = Arc::clone(&stop);
        let ctx = ctx.clone();
        spawn_worker(w, &mut workers, &stop, move || {
            serve(&listener, &epoll, (io, bufs), &ctx, &stop_flag)
        })?;
    }
    Ok(FlowServer {
        local_addr,
        stop,
        open,
        accepted,
        received: Arc::new(AtomicU64::new(0)),
        // An open connection shows a client at work.
        client_silence: Duration::ZERO,
        gauge,
        workers,
    })
}

impl FlowServer {
    /// The address the server listens on (with the port it got).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections open now: accepted and not yet closed (by the client's
    /// end of stream, an error, or a finished connect-mode reply). Always 0
    /// on a datagram path, which has no connections.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections accepted so far (0 on a datagram path): with
    /// [`FlowServer::open_connections`], whether clients are still at work.
    pub fn accepted_connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Datagrams its workers have read so far, from anyone (0 on a
    /// connection path): on a datagram path, which has no connection to
    /// show it, whether clients are still at work.
    pub fn datagrams_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The longest its clients may send it nothing while still at work:
    /// zero on a connection path, whose open connections show them; on a
    /// datagram path the longest retry timeout ([`RETRY_MAX`]), which a
    /// flow whose request or reply was lost waits before it sends again.
    /// A server stopped sooner after its last datagram can close its port
    /// under such a flow, whose re-send then meets a refusal.
    pub fn longest_client_silence(&self) -> Duration {
        self.client_silence
    }

    /// The most bytes its workers' message buffers took at once so far
    /// ([`AlignedBuffer::footprint_bytes`](crate::buffer::AlignedBuffer::footprint_bytes)):
    /// a set per worker, sized to the message, and a buffer for each flow
    /// whose echo the socket held back.
    pub fn peak_buffer_bytes(&self) -> u64 {
        self.gauge.peak_bytes()
    }

    /// Stops accepting, lets the exchanges under way finish for up to
    /// 100 ms, closes every flow, joins the workers, and returns what was
    /// moved. Takes at most about 150 ms plus the time to close.
    pub fn stop(mut self) -> Result<ServerTotals, EngineError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut totals = ServerTotals::default();
        let mut first_err = None;
        for h in std::mem::take(&mut self.workers) {
            match h.join() {
                Ok(Ok(t)) => totals.add(&t),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(EngineError::WorkerPanicked);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(totals),
        }
    }
}

/// [`FlowServer::bind`] for a datagram path: a UDP socket and an answering
/// thread per worker.
fn bind_datagrams(
    addr: SocketAddr,
    work: FlowWork,
    cfg: &EngineConfig,
    flows: Option<usize>,
) -> Result<FlowServer, EngineError> {
    let FlowWork::PingPong { size_bytes } = work else {
        return Err(EngineError::Invalid(format!(
            "{} carries pingpong flows only",
            cfg.path.name()
        )));
    };
    let queue = flows.map(|n| datagram::queue_bytes(n, cfg.workers, size_bytes));
    let sockets = datagram::bind(addr, cfg.workers, &cfg.options, queue)
        .map_err(|source| EngineError::Bind { addr, source })?;
    let local_addr = sockets
        .first()
        .map(|s| s.local_addr())
        .transpose()
        .map_err(|source| EngineError::Bind { addr, source })?
        .unwrap_or(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let gauge = Arc::new(BufferGauge::default());
    let mut workers = Vec::with_capacity(sockets.len());
    for (w, socket) in sockets.into_iter().enumerate() {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| sys("creating an epoll instance", e))?;
        datagram::watch(&epoll, &socket)?;
        let stop_flag = Arc::clone(&stop);
        let received = Arc::clone(&received);
        let (mode, token, rate) = (cfg.mode, cfg.token.clone(), cfg.rate.clone());
        let layout = cfg.buffer_layout()?;
        let gauge = Arc::clone(&gauge);
        spawn_worker(w, &mut workers, &stop, move || {
            datagram::serve(
                &socket,
                &epoll,
                (size_bytes, layout, &gauge),
                (mode, token, rate.as_deref()),
                &stop_flag,
                &received,
            )
        })?;
    }
    Ok(FlowServer {
        local_addr,
        stop,
        open: Arc::new(AtomicUsize::new(0)),
        accepted: Arc::new(AtomicU64::new(0)),
        received,
        client_silence: crate::rto::RETRY_MAX,
        gauge,
        workers,
    })
}

/// A server dropped without [`FlowServer::stop`] (its session ended before
/// the run) still stops its workers: they close every connection and exit
/// at their next tick.
impl Drop for FlowServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Raises the soft descriptor limit to the hard one. Best effort: the
/// server still serves what fits if this fails.
fn raise_fd_limit() {
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ = limits::ensure_fd_limit(hard);
    }
}

fn sys(what: &str, e: Errno) -> EngineError {
    EngineError::Sys {
        what: what.into(),
        source: e.into(),
    }
}

/// Binds a listener for flows of `cfg` at `addr` (port 0 picks one), with
/// the transport's socket options, for servers of other processes to share
/// ([`FlowServer::on_listener`]).
pub fn bind_listener(addr: SocketAddr, cfg: &EngineConfig) -> Result<TcpListener, EngineError> {
    cfg.validate()?;
    listen(addr, &cfg.options, cfg.path.name()).map_err(|source| EngineError::Bind { addr, source })
}

fn listen(
    addr: SocketAddr,
    options: &TransportOptions,
    transport: &'static str,
) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Accepted connections inherit the buffer sizes and congestion control.
    crate::sockopt::apply_before_connect(transport, &socket, options)
        .map_err(std::io::Error::other)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// One server worker: accepts when the listener wakes it, pumps its flows,
/// and returns its totals once `stop` is set. In poll mode it never sleeps
/// in epoll.
fn serve(
    listener: &TcpListener,
    epoll: &Epoll,
    (mut io, mut bufs): (Box<dyn WorkerIo>, WorkerBuffers),
    ctx: &Ctx,
    stop: &AtomicBool,
) -> Result<ServerTotals, EngineError> {
    let mut totals = ServerTotals::default();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = vec![EpollEvent::empty(); 256];
    let wait_ms = match ctx.mode {
        Mode::Event => STOP_POLL_MS,
        Mode::Poll => 0,
    };
    // The worker's flows, with what serving them needs, for the whole loop.
    let mut w = WorkerState {
        open: &ctx.open,
        epoll,
        io: &mut *io,
        bufs: &mut bufs,
        conns: &mut conns,
        free: &mut free,
        totals: &mut totals,
    };
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    // Once stopped: accept no more, and give the exchanges under way until
    // then to finish. A connection accepted after the stop could prove the
    // session and have its client send a request that nobody reads.
    let mut closing_by: Option<Instant> = None;
    // Whether the listener is in this worker's epoll: out of it while the
    // server holds its most connections, so a full worker neither spins on
    // a readable listener nor takes what other processes could serve.
    let mut listening = true;
    loop {
        let now = Instant::now();
        if closing_by.is_none() && stop.load(Ordering::Relaxed) {
            if listening {
                let _ = epoll.delete(listener);
                listening = false;
            }
            closing_by = Some(now + STOP_DRAIN);
        }
        if !listening && closing_by.is_none() && ctx.open.load(Ordering::Relaxed) < ctx.max_open {
            listening = epoll
                .add(listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))
                .is_ok();
        }
        if let Some(by) = closing_by {
            if now >= by || w.conns.iter().all(Option::is_none) {
                break;
            }
        }
        if now >= next_sweep {
            next_sweep = now + SWEEP_EVERY;
            drop_slow_provers(&mut w, now);
        }
        let wait_ms = if closing_by.is_some() {
            wait_ms.min(10)
        } else {
            wait_ms
        };
        // Ahead of the rate budget: sleep it off before serving more.
        super::io::wait_for_budget(
            ctx.rate.as_deref(),
            stop,
            Duration::from_millis(STOP_POLL_MS.into()),
        );
        let n = match epoll.wait(&mut events, wait_ms) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            // The rest stay ready (level-triggered) for after the wait.
            if super::io::ahead(ctx.rate.as_deref()) {
                break;
            }
            let token = ev.data();
            if token == LISTENER {
                if closing_by.is_some() || !listening {
                    continue;
                }
                if accept_batch(listener, &mut w, ctx) == Accepted::Full {
                    let _ = epoll.delete(listener);
                    listening = false;
                }
                continue;
            }
            service(&mut w, token as usize);
        }
    }
    for slot in 0..w.conns.len() {
        close(&mut w, slot);
    }
    Ok(totals)
}

/// One worker's flows and what it needs to serve them.
struct WorkerState<'a> {
    /// The server's count of open connections.
    open: &'a AtomicUsize,
    epoll: &'a Epoll,
    io: &'a mut dyn WorkerIo,
    /// What every flow of the worker reads into and sends from.
    bufs: &'a mut WorkerBuffers,
    conns: &'a mut Vec<Option<Conn>>,
    free: &'a mut Vec<usize>,
    totals: &'a mut ServerTotals,
}

/// Pumps the flow in `slot` (if it is still open) and sets its epoll
/// interest to what it waits for next, or closes it.
fn service(w: &mut WorkerState<'_>, slot: usize) {
    let Some(Some(conn)) = w.conns.get_mut(slot) else {
        return;
    };
    let proven = match conn.proof.as_mut().map(|(p, _)| p.pump(&mut &conn.stream)) {
        None => None,
        Some(Ok(Progress::Done)) => {
            conn.proof = None;
            None
        }
        Some(Ok(waiting)) => Some(Ok(waiting)),
        Some(Err(_)) => {
            // A stranger: closed before it gets a byte of the role.
            w.totals.strangers += 1;
            Some(Err(()))
        }
    };
    let pumped = match proven {
        Some(Ok(waiting)) => Ok(waiting),
        Some(Err(())) => Err(()),
        None => conn
            .machine
            .pump(&mut Io::new(conn.stream.as_fd(), &mut *w.io), w.bufs)
            .map_err(|_| ()),
    };
    let next = match pumped {
        Ok(Progress::WantRead) => Some(EpollFlags::EPOLLIN),
        Ok(Progress::WantWrite) => Some(EpollFlags::EPOLLOUT),
        Ok(Progress::Done) => {
            w.totals.connections_completed += 1;
            None
        }
        Err(_) => {
            w.totals.errors += 1;
            None
        }
    };
    match next {
        Some(interest) if interest != conn.interest => {
            conn.interest = interest;
            let mut ev = EpollEvent::new(interest, slot as u64);
            if w.epoll.modify(&conn.stream, &mut ev).is_err() {
                w.totals.errors += 1;
                close(w, slot);
            }
        }
        Some(_) => {}
        // Dropping the stream closes it, which also removes it from epoll;
        // in connect mode this is the server closing first.
        None => close(w, slot),
    }
}

/// Closes the connections that did not prove the session by their
/// deadline: a silent stranger holds a descriptor for the I/O timeout at
/// most.
fn drop_slow_provers(w: &mut WorkerState<'_>, now: Instant) {
    for slot in 0..w.conns.len() {
        let late = w.conns[slot]
            .as_ref()
            .and_then(|c| c.proof.as_ref())
            .is_some_and(|(_, by)| *by <= now);
        if late {
            w.totals.strangers += 1;
            w.totals.errors += 1;
            close(w, slot);
        }
    }
}

fn close(w: &mut WorkerState<'_>, slot: usize) {
    if let Some(conn) = w.conns[slot].take() {
        w.open.fetch_sub(1, Ordering::Relaxed);
        let moved = conn.machine.moved();
        w.totals.bytes_rx += moved.rx_bytes;
        w.totals.bytes_tx += moved.tx_bytes;
        w.free.push(slot);
    }
}

/// How a batch of accepts ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepted {
    /// Nothing more is queued, or the batch is done, or accepting failed
    /// for now.
    ForNow,
    /// The server holds its most connections: accept no more until one
    /// closes.
    Full,
}

/// Takes one place under the server's cap of open connections, if there
/// is one left; the place is the connection's until [`close`] (or given
/// back when no connection comes of it).
fn reserve(open: &AtomicUsize, max_open: usize) -> bool {
    open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        (n < max_open).then_some(n + 1)
    })
    .is_ok()
}

fn accept_batch(listener: &TcpListener, w: &mut WorkerState<'_>, ctx: &Ctx) -> Accepted {
    for _ in 0..ACCEPT_BATCH {
        if !reserve(w.open, ctx.max_open) {
            return Accepted::Full;
        }
        match accept_one(listener, w, ctx) {
            Some(Ok(slot)) => {
                ctx.accepted.fetch_add(1, Ordering::Relaxed);
                // A connect-mode request (or a zero-byte one, or the
                // proof's hello) is often already there; serving it now
                // saves a trip through epoll.
                service(w, slot);
            }
            Some(Err(())) => {
                w.open.fetch_sub(1, Ordering::Relaxed);
            }
            None => {
                w.open.fetch_sub(1, Ordering::Relaxed);
                return Accepted::ForNow;
            }
        }
    }
    Accepted::ForNow
}

/// Accepts one connection into a free slot, its place under the cap
/// already taken: `Some(Ok(slot))` when it is held, `Some(Err(()))` when
/// this one came to nothing (the next may do better), `None` when nothing
/// more can be accepted now.
fn accept_one(
    listener: &TcpListener,
    w: &mut WorkerState<'_>,
    ctx: &Ctx,
) -> Option<Result<usize, ()>> {
    {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e)
                if e.kind() == ErrorKind::Interrupted
                    || e.kind() == ErrorKind::ConnectionAborted =>
            {
                return Some(Err(()))
            }
            Err(_) => {
                // Out of descriptors or memory: the connection stays queued
                // and level triggering brings it back; pause briefly so the
                // worker keeps serving its flows instead of spinning.
                w.totals.errors += 1;
                std::thread::sleep(Duration::from_millis(1));
                return None;
            }
        };
        if stream.set_nonblocking(true).is_err()
            || crate::sockopt::apply_connected(ctx.transport, &stream, &ctx.options).is_err()
        {
            w.totals.errors += 1;
            return Some(Err(()));
        }
        w.totals.connections_accepted += 1;
        let slot = w.free.pop().unwrap_or_else(|| {
            w.conns.push(None);
            w.conns.len() - 1
        });
        if w.epoll
            .add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, slot as u64))
            .is_err()
        {
            w.totals.errors += 1;
            w.free.push(slot);
            return Some(Err(()));
        }
        let proof = match &ctx.token {
            None => None,
            Some(token) => match ListenerHandshake::new(token) {
                Ok(p) => Some((Box::new(p), Instant::now() + ctx.io_timeout)),
                Err(_) => {
                    w.totals.errors += 1;
                    let _ = w.epoll.delete(&stream);
                    w.free.push(slot);
                    return Some(Err(()));
                }
            },
        };
        w.conns[slot] = Some(Conn {
            stream,
            proof,
            machine: ctx.work.server_machine(),
            interest: EpollFlags::EPOLLIN,
        });
        Some(Ok(slot))
    }
}

type Worker = JoinHandle<Result<ServerTotals, EngineError>>;

/// Starts server worker `w` running `work`; if the thread cannot start,
/// stops and joins the workers already started and says why.
fn spawn_worker(
    w: usize,
    workers: &mut Vec<Worker>,
    stop: &Arc<AtomicBool>,
    work: impl FnOnce() -> Result<ServerTotals, EngineError> + Send + 'static,
) -> Result<(), EngineError> {
    match std::thread::Builder::new()
        .name(format!("flow-server-{w}"))
        .spawn(work)
    {
        Ok(h) => {
            workers.push(h);
            Ok(())
        }
        Err(source) => {
            stop.store(true, Ordering::Relaxed);
            for h in workers.drain(..) {
                let _ = h.join();
            }
            Err(EngineError::Sys {
                what: "starting a flow server worker".into(),
                source,
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Two servers on one listener, as two processes of a server spread
    /// over processes share it: each holds at most its cap, and the other
    /// takes the rest.
    #[test]
    fn servers_sharing_a_listener_each_hold_at_most_their_cap() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let work = FlowWork::PingPong { size_bytes: 1 };
        let cfg = EngineConfig::tcp(2, Duration::from_secs(5));
        let a =
            FlowServer::on_listener(listener.try_clone().unwrap(), work, cfg.clone(), 3).unwrap();
        let b = FlowServer::on_listener(listener, work, cfg.clone(), 3).unwrap();
        let mut clients = Vec::new();
        for i in 0..6u8 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(&[i]).unwrap();
            let mut back = [0u8];
            c.read_exact(&mut back).unwrap();
            assert_eq!(back[0], i);
            clients.push(c);
        }
        assert_eq!(a.open_connections(), 3);
        assert_eq!(b.open_connections(), 3);
        // A seventh waits in the queue: nobody has a place for it.
        let mut late = TcpStream::connect(addr).unwrap();
        late.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        late.write_all(&[7]).unwrap();
        assert!(late.read_exact(&mut [0u8]).is_err());
        // One leaves: its server takes the seventh.
        drop(clients.remove(0));
        late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut back = [0u8];
        late.read_exact(&mut back).unwrap();
        assert_eq!(back[0], 7);
        drop(clients);
        drop(late);
        let (ta, tb) = (a.stop().unwrap(), b.stop().unwrap());
        assert_eq!(ta.connections_accepted + tb.connections_accepted, 7);
        assert_eq!(ta.bytes_rx + tb.bytes_rx, 7);
        assert!(
            FlowServer::on_listener(TcpListener::bind("127.0.0.1:0").unwrap(), work, cfg, 0)
                .is_err()
        );
    }
}
