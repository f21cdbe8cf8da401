//! The client side of the flow engine. [`prepare`] opens the flows and
//! hands each worker its slice (flow `i` to worker `i % workers`) with an
//! epoll instance; [`PreparedClients::run`] starts the workers together,
//! each runs its flows through warm-up, the measured window and the stop,
//! then the per-flow outcomes are gathered in flow order.
//!
//! At the end of the window no flow starts a new exchange; exchanges under
//! way finish (within the I/O timeout) so that bytes sent equal bytes the
//! server received and every connection closes cleanly.
//!
//! Datagram flows (a [`DataPath::datagrams`](super::DataPath::datagrams)
//! path) wait only for reads; their re-sends are due at deadlines kept in
//! the worker's [`RetryQueue`], which sets how long the worker may sleep.
//!
//! A worker's flows send from and read into the worker's buffers
//! ([`WorkerBuffers`]); a flow holds none of its own.

use super::buffers::{BufferGauge, Side, WorkerBuffers};
use super::datagram::{self, DatagramClient, RetryQueue};
use super::io::WorkerIo;
use super::machine::{ConnectClient, PingPongClient};
use super::proof::ConnectorHandshake;
use super::{
    limits, setup, ClientReport, ClientSpec, EngineConfig, EngineError, FlowOutcome, FlowWork,
};
use crate::rto::{Hysteresis, RetryTimeout};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_core::stats::FlowHistogram;
use netgap_proto::dataproof::DataToken;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod datagrams;
mod worker;

use worker::run_worker;

/// The longest a worker sleeps in epoll before checking timeouts, the
/// schedule and the abort flag, ms.
const TICK_MS: u64 = 50;
/// How long a connect-mode flow waits after a failed connection before the
/// next attempt, so a refusing target is not hammered in a tight loop.
const RETRY_DELAY: Duration = Duration::from_millis(1);

/// Flows opened by [`prepare_clients`](super::prepare_clients), ready to
/// [`run`](PreparedClients::run). Dropping it closes every flow.
#[derive(Debug)]
pub struct PreparedClients {
    target: SocketAddr,
    flows: usize,
    work: FlowWork,
    bind_ip: Option<std::net::IpAddr>,
    io_timeout: Duration,
    mode: Mode,
    transport: &'static str,
    options: TransportOptions,
    token: Option<DataToken>,
    rate: Option<Arc<crate::rate::RateBudget>>,
    workers: Vec<Worker>,
    /// What the workers' buffers hold.
    gauge: Arc<BufferGauge>,
}

/// One worker's flows, epoll instance, data path and message buffers.
#[derive(Debug)]
struct Worker {
    epoll: Epoll,
    io: Box<dyn WorkerIo>,
    /// Every flow of the worker sends from and reads into these.
    bufs: WorkerBuffers,
    flows: Vec<Flow>,
    /// When the datagram flows' re-sends are due (empty without them).
    retries: RetryQueue,
    /// The retry timeout of the datagram flows' next requests.
    rto: RetryTimeout,
}

#[derive(Debug)]
struct Flow {
    index: u32,
    hist: FlowHistogram,
    round_trips: u64,
    window_bytes_tx: u64,
    window_bytes_rx: u64,
    errors: u64,
    /// Connections whose reply arrived, whole run (Connect).
    completed: u64,
    /// The current connection's setup time, ns, once it is connected
    /// (Connect).
    setup_ns: u64,
    /// Setup time of the connections counted in `round_trips`, ns.
    window_setup_ns: u64,
    /// When the current exchange (round trip or connection) began.
    t0: Instant,
    /// When the flow last moved a byte or began an exchange.
    last_progress: Instant,
    /// The epoll interest registered, `None` if not registered.
    interest: Option<EpollFlags>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    PingPong {
        stream: TcpStream,
        m: PingPongClient,
    },
    Connect {
        stream: Option<TcpStream>,
        connecting: bool,
        /// The session proof of the current connection, between its
        /// handshake and its request (runs with a token only).
        proof: Option<Box<ConnectorHandshake>>,
        timed: bool,
        m: ConnectClient,
    },
    Datagram {
        socket: UdpSocket,
        m: DatagramClient,
        /// When the current request is sent again, `None` while idle.
        retry_at: Option<Instant>,
        /// The current request's backoff: the wait before `retry_at`.
        backoff: Duration,
        /// Whether the worker's retry queue holds an entry for this flow.
        queued: bool,
    },
}

impl Flow {
    /// Flow `index` before its first exchange, which `now` stands for until
    /// the run begins it.
    fn new(index: u32, now: Instant, interest: Option<EpollFlags>, kind: Kind) -> Self {
        Flow {
            index,
            hist: FlowHistogram::new(),
            round_trips: 0,
            window_bytes_tx: 0,
            window_bytes_rx: 0,
            errors: 0,
            completed: 0,
            setup_ns: 0,
            window_setup_ns: 0,
            t0: now,
            last_progress: now,
            interest,
            kind,
        }
    }

    fn busy(&self) -> bool {
        match &self.kind {
            Kind::PingPong { m, .. } => m.busy(),
            Kind::Connect { stream, .. } => stream.is_some(),
            Kind::Datagram { m, .. } => m.waiting(),
        }
    }
}

/// When the phases of a run begin and end.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    warm_end: Instant,
    end: Instant,
}

impl Schedule {
    fn in_window(&self, t: Instant) -> bool {
        t >= self.warm_end && t < self.end
    }
}

pub(super) fn prepare(
    spec: &ClientSpec,
    cfg: &EngineConfig,
) -> Result<PreparedClients, EngineError> {
    spec.work.validate(cfg.path)?;
    cfg.validate()?;
    if spec.flows == 0 {
        return Err(EngineError::Invalid(
            "a client needs at least 1 flow".into(),
        ));
    }
    if spec.flows > u32::MAX as usize {
        return Err(EngineError::Invalid(format!(
            "{} flows is more than the engine can number",
            spec.flows
        )));
    }
    limits::ensure_fd_limit(spec.flows as u64 + cfg.workers as u64 + limits::SPARE_FDS)?;
    limits::check_port_range(spec.flows as u64, limits::local_port_range(), spec.target)?;

    let workers_n = cfg.workers.min(spec.flows);
    let gauge = Arc::new(BufferGauge::default());
    let mut workers = Vec::with_capacity(workers_n);
    for _ in 0..workers_n {
        workers.push(new_worker(spec, cfg, workers_n, &gauge)?);
    }
    // Connections are opened paced, all before any flow is handed to a
    // worker; they then go to their workers in flow order.
    let mut streams = match spec.work {
        FlowWork::PingPong { .. } if !cfg.path.datagrams() => {
            setup::connect_all(spec, cfg, setup::CONNECT_WINDOW)?.into_iter()
        }
        _ => Vec::new().into_iter(),
    };
    let now = Instant::now();
    for i in 0..spec.flows {
        let index = i as u32;
        let w = &mut workers[i % workers_n];
        let (kind, interest) = open_flow(w, index, spec, cfg, &mut streams)?;
        w.flows.push(Flow::new(index, now, interest, kind));
    }
    Ok(PreparedClients {
        target: spec.target,
        flows: spec.flows,
        work: spec.work,
        bind_ip: spec.bind_ip,
        io_timeout: cfg.io_timeout,
        mode: cfg.mode,
        transport: cfg.path.name(),
        options: cfg.options.clone(),
        token: cfg.token.clone(),
        rate: cfg.rate.clone(),
        workers,
        gauge,
    })
}

/// A worker's epoll instance, data path and message buffers, with room for
/// its share of the `spec`'s flows.
fn new_worker(
    spec: &ClientSpec,
    cfg: &EngineConfig,
    workers_n: usize,
    gauge: &Arc<BufferGauge>,
) -> Result<Worker, EngineError> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
        .map_err(|e| sys("creating an epoll instance", e))?;
    let io = super::io::worker_io(cfg).map_err(|source| EngineError::Sys {
        what: format!("setting up the {} data path of a worker", cfg.path.name()),
        source,
    })?;
    Ok(Worker {
        epoll,
        io,
        bufs: super::buffers::for_worker(spec.work, Side::Client, cfg, gauge)?,
        flows: Vec::with_capacity(spec.flows / workers_n + 1),
        retries: RetryQueue::default(),
        rto: RetryTimeout::new(Hysteresis::None),
    })
}

/// Flow `index`'s state for its worker `w`: a datagram flow's socket, opened
/// and added to the worker's epoll here; a pingpong flow's connection, the
/// next of `streams` (opened beforehand, in flow order), added likewise; a
/// connect-mode flow with no connection yet. With the epoll interest
/// registered, if any.
fn open_flow(
    w: &mut Worker,
    index: u32,
    spec: &ClientSpec,
    cfg: &EngineConfig,
    streams: &mut impl Iterator<Item = TcpStream>,
) -> Result<(Kind, Option<EpollFlags>), EngineError> {
    let opened = match spec.work {
        FlowWork::PingPong { size_bytes } if cfg.path.datagrams() => {
            let socket = datagram::open_flow(
                spec.target,
                spec.bind_ip,
                &cfg.options,
                cfg.io_timeout,
                cfg.token.as_ref(),
            )
            .map_err(|source| EngineError::Connect {
                index,
                target: spec.target,
                source,
            })?;
            let token = w.flows.len() as u64;
            // Replies are all a datagram flow waits for: its interest
            // never changes.
            w.epoll
                .add(&socket, EpollEvent::new(EpollFlags::EPOLLIN, token))
                .map_err(|e| sys("adding a flow to epoll", e))?;
            (
                Kind::Datagram {
                    socket,
                    m: DatagramClient::new(size_bytes),
                    retry_at: None,
                    backoff: Duration::ZERO,
                    queued: false,
                },
                Some(EpollFlags::EPOLLIN),
            )
        }
        FlowWork::PingPong { size_bytes } => {
            let stream = streams
                .next()
                .ok_or_else(|| EngineError::Invalid(format!("flow {index} was not opened")))?;
            let token = w.flows.len() as u64;
            w.epoll
                .add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, token))
                .map_err(|e| sys("adding a flow to epoll", e))?;
            (
                Kind::PingPong {
                    stream,
                    m: PingPongClient::new(size_bytes),
                },
                Some(EpollFlags::EPOLLIN),
            )
        }
        FlowWork::Connect {
            request_bytes,
            reply_bytes,
        } => (
            Kind::Connect {
                stream: None,
                connecting: false,
                proof: None,
                timed: false,
                m: ConnectClient::new(request_bytes, reply_bytes),
            },
            None,
        ),
    };
    Ok(opened)
}

fn sys(what: &str, e: Errno) -> EngineError {
    EngineError::Sys {
        what: what.into(),
        source: e.into(),
    }
}

/// A socket for one connection to `target`, with the options that must
/// precede the connection applied.
pub(super) fn new_socket(
    target: SocketAddr,
    bind_ip: Option<std::net::IpAddr>,
    transport: &'static str,
    options: &TransportOptions,
) -> std::io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    crate::sockopt::apply_before_connect(transport, &socket, options)
        .map_err(std::io::Error::other)?;
    // TCP_NODELAY and SO_BUSY_POLL hold from the first byte when set before
    // the connection.
    let stream: TcpStream = socket.into();
    crate::sockopt::apply_connected(transport, &stream, options).map_err(std::io::Error::other)?;
    let socket = Socket::from(stream);
    if let Some(ip) = bind_ip {
        // Without this, bind picks the local port before the destination is
        // known, so each port serves one connection to any target and the
        // port range runs out long before it would for connect().
        bind_address_no_port(&socket);
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    Ok(socket)
}

/// Sets IP_BIND_ADDRESS_NO_PORT (Linux 4.2+); best effort, since without it
/// binding still works, only with fewer usable ports.
fn bind_address_no_port(socket: &Socket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: the descriptor is open for the lifetime of `socket`, and the
    // option value points to a live c_int whose size is passed with it.
    let _ = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

impl PreparedClients {
    /// The bytes its workers' message buffers take
    /// ([`AlignedBuffer::footprint_bytes`](crate::buffer::AlignedBuffer::footprint_bytes)):
    /// a set per worker, sized to the message, and nothing per flow.
    pub fn buffer_bytes(&self) -> u64 {
        self.gauge.held_bytes()
    }

    /// Phase 2 (after the coordinator's barrier): runs every flow for
    /// `warmup` (not counted) then `duration` (the measured window), stops
    /// all flows together, and reports per flow. PingPong: any flow failing
    /// (peer closed, reset, no progress within the I/O timeout) ends the run
    /// with an error naming the flow and the target. Connect: failed
    /// connections are counted per flow and retried; an error only if no
    /// connection of any flow succeeded.
    pub fn run(self, warmup: Duration, duration: Duration) -> Result<ClientReport, EngineError> {
        self.run_stoppable(warmup, duration, Arc::new(AtomicBool::new(false)))
    }

    /// [`PreparedClients::run`], ending every flow early (within one
    /// worker tick) once `stop` is set: the run then reports no flows.
    pub fn run_stoppable(
        self,
        warmup: Duration,
        duration: Duration,
        stop: Arc<AtomicBool>,
    ) -> Result<ClientReport, EngineError> {
        let PreparedClients {
            target,
            flows,
            work,
            bind_ip,
            io_timeout,
            mode,
            transport,
            options,
            token,
            rate,
            workers,
            gauge: _,
        } = self;
        let span = warmup
            .checked_add(duration)
            .filter(|d| d.as_secs() < MAX_RUN_SECS)
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "a flow run of {warmup:?} warm-up and {duration:?} is too long"
                ))
            })?;
        let ctx = Ctx {
            target,
            bind_ip,
            io_timeout,
            mode,
            transport,
            options,
            token,
            rate,
        };
        let abort = stop;
        let (handles, starts) = spawn_workers(workers, &ctx, &abort)?;
        // Every worker exists before the clock starts, so all flows begin
        // within one wake-up of each other.
        let start = Instant::now();
        let schedule = Schedule {
            warm_end: start + warmup,
            end: start + span,
        };
        for tx in &starts {
            // A worker that is gone already reports through its handle.
            let _ = tx.send(schedule);
        }
        gather(handles, flows, work, target, duration)
    }
}

/// A worker's thread: its flows' outcomes, or why it stopped.
type WorkerHandle = std::thread::JoinHandle<Result<Vec<Finished>, EngineError>>;

/// Starts a thread per worker, each waiting for the run's schedule on its
/// channel and setting `abort` if it fails. If a thread cannot start, those
/// started see their channels close and end, and are joined.
fn spawn_workers(
    workers: Vec<Worker>,
    ctx: &Ctx,
    abort: &Arc<AtomicBool>,
) -> Result<(Vec<WorkerHandle>, Vec<mpsc::Sender<Schedule>>), EngineError> {
    let mut handles = Vec::with_capacity(workers.len());
    let mut starts = Vec::with_capacity(workers.len());
    for (w, worker) in workers.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel::<Schedule>();
        let abort = Arc::clone(abort);
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("flow-client-{w}"))
            .spawn(move || {
                // A closed channel means the run was abandoned before it began.
                let Ok(schedule) = rx.recv() else {
                    return Ok(Vec::new());
                };
                let result = run_worker(worker, schedule, &ctx, &abort);
                if result.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                result
            });
        match spawned {
            Ok(h) => {
                handles.push(h);
                starts.push(tx);
            }
            Err(source) => {
                drop(starts);
                for h in handles {
                    let _ = h.join();
                }
                return Err(EngineError::Sys {
                    what: "starting a flow client worker".into(),
                    source,
                });
            }
        }
    }
    Ok((handles, starts))
}

/// Joins the workers and puts their flows' outcomes in flow order: the
/// first worker's error if any failed, and for connect-mode flows an error
/// if no connection of any flow completed.
fn gather(
    handles: Vec<WorkerHandle>,
    flows: usize,
    work: FlowWork,
    target: SocketAddr,
    duration: Duration,
) -> Result<ClientReport, EngineError> {
    let mut outcomes = Vec::with_capacity(flows);
    let mut first_err: Option<EngineError> = None;
    for h in handles {
        match h.join() {
            Ok(Ok(mut o)) => outcomes.append(&mut o),
            Ok(Err(EngineError::Invalid(msg))) if msg == ABORTED => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(EngineError::WorkerPanicked);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    outcomes.sort_by_key(|o| o.index);
    if let FlowWork::Connect { .. } = work {
        let completed: u64 = outcomes.iter().map(|o| o.completed).sum();
        if completed == 0 {
            let errors = outcomes.iter().map(|o| o.outcome.errors).sum();
            let last = outcomes
                .iter()
                .rev()
                .find_map(|o| o.last_error.clone())
                .unwrap_or_else(|| {
                    "no connection completed before the run ended; lengthen the run".into()
                });
            return Err(EngineError::AllFlowsFailed {
                flows,
                target,
                errors,
                last,
            });
        }
    }
    Ok(ClientReport {
        flows: outcomes.into_iter().map(|o| o.outcome).collect(),
        elapsed_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
    })
}

/// The longest run (warm-up and window) the engine accepts, seconds: far
/// past any test, and small enough that no deadline arithmetic overflows.
const MAX_RUN_SECS: u64 = 365 * 24 * 3600;

/// The marker a worker returns when it stopped because another failed.
const ABORTED: &str = "aborted because another flow worker failed";

/// What every worker of a run shares.
#[derive(Debug, Clone)]
struct Ctx {
    target: SocketAddr,
    bind_ip: Option<std::net::IpAddr>,
    io_timeout: Duration,
    mode: Mode,
    transport: &'static str,
    options: TransportOptions,
    token: Option<DataToken>,
    /// The budget every byte of the run is charged to, if paced.
    rate: Option<Arc<crate::rate::RateBudget>>,
}

/// A flow's outcome with what the gathering step needs besides.
struct Finished {
    index: u32,
    completed: u64,
    last_error: Option<String>,
    outcome: FlowOutcome,
}
