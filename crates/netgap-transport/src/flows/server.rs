//! The server side of the flow engine: `workers` threads, each with its
//! own epoll instance and its own listening socket on the one port
//! (SO_REUSEPORT), so the kernel spreads incoming connections evenly over
//! the workers by their addresses, and each worker accepts and keeps its
//! flows for their whole life without sharing anything with the others.

use super::machine::{ConnectServer, EchoServer, MachineError, Moved, Progress};
use super::{limits, EngineConfig, EngineError, FlowWork, ServerTotals};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The epoll token of the listener; flows use their slot number.
const LISTENER: u64 = u64::MAX;
/// How long a worker sleeps in epoll before looking at the stop flag, ms.
const STOP_POLL_MS: u16 = 50;
/// Connections one worker accepts per wake-up before serving its flows, so
/// a burst of connects does not starve the flows it already has.
const ACCEPT_BATCH: usize = 64;
/// The listen backlog asked for (the kernel caps it at net.core.somaxconn):
/// thousands of flows connect in a burst.
const BACKLOG: i32 = 4096;

/// Accepts and serves any number of flows on one listener with
/// `cfg.workers` epoll threads, until [`FlowServer::stop`].
#[derive(Debug)]
pub struct FlowServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Result<ServerTotals, EngineError>>>,
}

enum Machine {
    Echo(EchoServer),
    Connect(ConnectServer),
}

impl Machine {
    fn new(work: FlowWork) -> Machine {
        match work {
            FlowWork::PingPong { size_bytes } => Machine::Echo(EchoServer::new(size_bytes)),
            FlowWork::Connect {
                request_bytes,
                reply_bytes,
            } => Machine::Connect(ConnectServer::new(request_bytes, reply_bytes)),
        }
    }
    fn pump(&mut self, io: &mut &TcpStream) -> Result<Progress, MachineError> {
        match self {
            Machine::Echo(m) => m.pump(io),
            Machine::Connect(m) => m.pump(io),
        }
    }
    fn moved(&self) -> Moved {
        match self {
            Machine::Echo(m) => m.moved,
            Machine::Connect(m) => m.moved,
        }
    }
}

struct Conn {
    stream: TcpStream,
    machine: Machine,
    interest: EpollFlags,
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
        work.validate()?;
        cfg.validate()?;
        if let Ok((_, hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            // Best effort: the server still serves what fits if this fails.
            let _ = limits::ensure_fd_limit(hard);
        }
        let first = listen(addr).map_err(|source| EngineError::Bind { addr, source })?;
        let local_addr = first
            .local_addr()
            .map_err(|source| EngineError::Bind { addr, source })?;
        let mut listeners = vec![first];
        for _ in 1..cfg.workers {
            listeners.push(listen(local_addr).map_err(|source| EngineError::Bind {
                addr: local_addr,
                source,
            })?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(cfg.workers);
        for (w, listener) in listeners.into_iter().enumerate() {
            let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
                .map_err(|e| sys("creating an epoll instance", e))?;
            epoll
                .add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))
                .map_err(|e| sys("adding the listener to epoll", e))?;
            let stop_flag = Arc::clone(&stop);
            let spawned = std::thread::Builder::new()
                .name(format!("flow-server-{w}"))
                .spawn(move || serve(&listener, &epoll, work, &stop_flag));
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
            workers,
        })
    }

    /// The address the server listens on (with the port it got).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes every flow, joins the workers, and returns
    /// what was moved. Takes at most about 50 ms plus the time to close.
    pub fn stop(self) -> Result<ServerTotals, EngineError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut totals = ServerTotals::default();
        let mut first_err = None;
        for h in self.workers {
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

fn sys(what: &str, e: Errno) -> EngineError {
    EngineError::Sys {
        what: what.into(),
        source: e.into(),
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// One server worker: accepts when the listener wakes it, pumps its flows,
/// and returns its totals once `stop` is set.
fn serve(
    listener: &TcpListener,
    epoll: &Epoll,
    work: FlowWork,
    stop: &AtomicBool,
) -> Result<ServerTotals, EngineError> {
    let mut totals = ServerTotals::default();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = vec![EpollEvent::empty(); 256];
    while !stop.load(Ordering::Relaxed) {
        let n = match epoll.wait(&mut events, STOP_POLL_MS) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            let token = ev.data();
            if token == LISTENER {
                accept_batch(listener, epoll, work, &mut conns, &mut free, &mut totals);
                continue;
            }
            service(epoll, &mut conns, &mut free, token as usize, &mut totals);
        }
    }
    for slot in 0..conns.len() {
        close(&mut conns, &mut free, slot, &mut totals);
    }
    Ok(totals)
}

/// Pumps the flow in `slot` (if it is still open) and sets its epoll
/// interest to what it waits for next, or closes it.
fn service(
    epoll: &Epoll,
    conns: &mut [Option<Conn>],
    free: &mut Vec<usize>,
    slot: usize,
    totals: &mut ServerTotals,
) {
    let Some(Some(conn)) = conns.get_mut(slot) else {
        return;
    };
    let next = match conn.machine.pump(&mut &conn.stream) {
        Ok(Progress::WantRead) => Some(EpollFlags::EPOLLIN),
        Ok(Progress::WantWrite) => Some(EpollFlags::EPOLLOUT),
        Ok(Progress::Done) => {
            totals.connections_completed += 1;
            None
        }
        Err(_) => {
            totals.errors += 1;
            None
        }
    };
    match next {
        Some(interest) if interest != conn.interest => {
            conn.interest = interest;
            let mut ev = EpollEvent::new(interest, slot as u64);
            if epoll.modify(&conn.stream, &mut ev).is_err() {
                totals.errors += 1;
                close(conns, free, slot, totals);
            }
        }
        Some(_) => {}
        // Dropping the stream closes it, which also removes it from epoll;
        // in connect mode this is the server closing first.
        None => close(conns, free, slot, totals),
    }
}

fn close(
    conns: &mut [Option<Conn>],
    free: &mut Vec<usize>,
    slot: usize,
    totals: &mut ServerTotals,
) {
    if let Some(conn) = conns[slot].take() {
        let moved = conn.machine.moved();
        totals.bytes_rx += moved.rx_bytes;
        totals.bytes_tx += moved.tx_bytes;
        free.push(slot);
    }
}

fn accept_batch(
    listener: &TcpListener,
    epoll: &Epoll,
    work: FlowWork,
    conns: &mut Vec<Option<Conn>>,
    free: &mut Vec<usize>,
    totals: &mut ServerTotals,
) {
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
                totals.errors += 1;
                std::thread::sleep(Duration::from_millis(1));
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
            totals.errors += 1;
            continue;
        }
        totals.connections_accepted += 1;
        let slot = free.pop().unwrap_or_else(|| {
            conns.push(None);
            conns.len() - 1
        });
        if epoll
            .add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, slot as u64))
            .is_err()
        {
            totals.errors += 1;
            free.push(slot);
            continue;
        }
        conns[slot] = Some(Conn {
            stream,
            machine: Machine::new(work),
            interest: EpollFlags::EPOLLIN,
        });
        // A connect-mode request (or a zero-byte one) is often already
        // there; serving it now saves a trip through epoll.
        service(epoll, conns, free, slot, totals);
    }
}
