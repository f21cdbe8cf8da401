//! The server side of the flow engine: `workers` threads, each with its
//! own epoll instance and its own listening socket on the one port
//! (SO_REUSEPORT), so the kernel spreads incoming connections evenly over
//! the workers by their addresses, and each worker accepts and keeps its
//! flows for their whole life without sharing anything with the others.
//! On a datagram path each worker has a UDP socket on the one port instead
//! and answers every flow the kernel steers to it (module `datagram`).

use super::datagram;
use super::io::{Io, WorkerIo};
use super::machine::{Progress, ServerMachine};
use super::proof::ListenerHandshake;
use super::{limits, EngineConfig, EngineError, FlowWork, ServerTotals};
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
    workers: Vec<JoinHandle<Result<ServerTotals, EngineError>>>,
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
    /// How long a connection may take to prove the session.
    io_timeout: Duration,
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
        work.validate(cfg.path)?;
        cfg.validate()?;
        if let Ok((_, hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            // Best effort: the server still serves what fits if this fails.
            let _ = limits::ensure_fd_limit(hard);
        }
        if cfg.path.datagrams() {
            return bind_datagrams(addr, work, &cfg);
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
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::with_capacity(cfg.workers);
        let ctx = Ctx {
            open: Arc::clone(&open),
            accepted: Arc::clone(&accepted),
            transport: cfg.path.name(),
            work,
            mode: cfg.mode,
            options: cfg.options.clone(),
            token: cfg.token.clone(),
            io_timeout: cfg.io_timeout,
        };
        for (w, listener) in listeners.into_iter().enumerate() {
            let io = cfg.path.worker().map_err(|source| EngineError::Sys {
                what: format!("setting up the {} data path of a worker", cfg.path.name()),
                source,
            })?;
            let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
                .map_err(|e| sys("creating an epoll instance", e))?;
            epoll
                .add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))
                .map_err(|e| sys("adding the listener to epoll", e))?;
            let stop_flag = Arc::clone(&stop);
            let ctx = ctx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("flow-server-{w}"))
                .spawn(move || serve(&listener, &epoll, io, &ctx, &stop_flag));
            match spawned {
                Ok(h) => workers.push(h),
                Err(source) => {
                    stop.store(true, Ordering::Relaxed);
                    for h in workers {
                        let _ = h.join();
                    }
                    return Err(EngineError::Sys {
                        what: "starting a flow server worker".into(),
                        source,
                    });
                }
            }
        }
        Ok(FlowServer {
            local_addr,
            stop,
            open,
            accepted,
            workers,
        })
    }

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
) -> Result<FlowServer, EngineError> {
    let FlowWork::PingPong { size_bytes } = work else {
        return Err(EngineError::Invalid(format!(
            "{} carries pingpong flows only",
            cfg.path.name()
        )));
    };
    let sockets = datagram::bind(addr, cfg.workers, &cfg.options)
        .map_err(|source| EngineError::Bind { addr, source })?;
    let local_addr = sockets
        .first()
        .map(|s| s.local_addr())
        .transpose()
        .map_err(|source| EngineError::Bind { addr, source })?
        .unwrap_or(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::with_capacity(sockets.len());
    for (w, socket) in sockets.into_iter().enumerate() {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| sys("creating an epoll instance", e))?;
        datagram::watch(&epoll, &socket)?;
        let stop_flag = Arc::clone(&stop);
        let (mode, token) = (cfg.mode, cfg.token.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("flow-server-{w}"))
            .spawn(move || datagram::serve(&socket, &epoll, size_bytes, mode, token, &stop_flag));
        match spawned {
            Ok(h) => workers.push(h),
            Err(source) => {
                stop.store(true, Ordering::Relaxed);
                for h in workers {
                    let _ = h.join();
                }
                return Err(EngineError::Sys {
                    what: "starting a flow server worker".into(),
                    source,
                });
            }
        }
    }
    Ok(FlowServer {
        local_addr,
        stop,
        open: Arc::new(AtomicUsize::new(0)),
        accepted: Arc::new(AtomicU64::new(0)),
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

fn sys(what: &str, e: Errno) -> EngineError {
    EngineError::Sys {
        what: what.into(),
        source: e.into(),
    }
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
    mut io: Box<dyn WorkerIo>,
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
    let io = &mut *io;
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    // Once stopped: accept no more, and give the exchanges under way until
    // then to finish. A connection accepted after the stop could prove the
    // session and have its client send a request that nobody reads.
    let mut closing_by: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if closing_by.is_none() && stop.load(Ordering::Relaxed) {
            let _ = epoll.delete(listener);
            closing_by = Some(now + STOP_DRAIN);
        }
        if let Some(by) = closing_by {
            if now >= by || conns.iter().all(Option::is_none) {
                break;
            }
        }
        if now >= next_sweep {
            next_sweep = now + SWEEP_EVERY;
            let mut w = WorkerState {
                open: &ctx.open,
                epoll,
                io: &mut *io,
                conns: &mut conns,
                free: &mut free,
                totals: &mut totals,
            };
            drop_slow_provers(&mut w, now);
        }
        let wait_ms = if closing_by.is_some() {
            wait_ms.min(10)
        } else {
            wait_ms
        };
        let n = match epoll.wait(&mut events, wait_ms) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            let token = ev.data();
            if token == LISTENER {
                if closing_by.is_some() {
                    continue;
                }
                let mut w = WorkerState {
                    open: &ctx.open,
                    epoll,
                    io: &mut *io,
                    conns: &mut conns,
                    free: &mut free,
                    totals: &mut totals,
                };
                accept_batch(listener, &mut w, ctx);
                continue;
            }
            let mut w = WorkerState {
                open: &ctx.open,
                epoll,
                io: &mut *io,
                conns: &mut conns,
                free: &mut free,
                totals: &mut totals,
            };
            service(&mut w, token as usize);
        }
    }
    let mut w = WorkerState {
        open: &ctx.open,
        epoll,
        io,
        conns: &mut conns,
        free: &mut free,
        totals: &mut totals,
    };
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
            .pump(&mut Io::new(conn.stream.as_fd(), &mut *w.io))
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

fn accept_batch(listener: &TcpListener, w: &mut WorkerState<'_>, ctx: &Ctx) {
    for _ in 0..ACCEPT_BATCH {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e)
                if e.kind() == ErrorKind::Interrupted
                    || e.kind() == ErrorKind::ConnectionAborted =>
            {
                continue
            }
            Err(_) => {
                // Out of descriptors or memory: the connection stays queued
                // and level triggering brings it back; pause briefly so the
                // worker keeps serving its flows instead of spinning.
                w.totals.errors += 1;
                std::thread::sleep(Duration::from_millis(1));
                return;
            }
        };
        if stream.set_nonblocking(true).is_err()
            || crate::sockopt::apply_connected(ctx.transport, &stream, &ctx.options).is_err()
        {
            w.totals.errors += 1;
            continue;
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
            continue;
        }
        let proof = match &ctx.token {
            None => None,
            Some(token) => match ListenerHandshake::new(token) {
                Ok(p) => Some((Box::new(p), Instant::now() + ctx.io_timeout)),
                Err(_) => {
                    w.totals.errors += 1;
                    let _ = w.epoll.delete(&stream);
                    w.free.push(slot);
                    continue;
                }
            },
        };
        w.open.fetch_add(1, Ordering::Relaxed);
        ctx.accepted.fetch_add(1, Ordering::Relaxed);
        w.conns[slot] = Some(Conn {
            stream,
            proof,
            machine: ctx.work.server_machine(),
            interest: EpollFlags::EPOLLIN,
        });
        // A connect-mode request (or a zero-byte one, or the proof's
        // hello) is often already there; serving it now saves a trip
        // through epoll.
        service(w, slot);
    }
}
