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
use super::io::{Io, WorkerIo};
use super::machine::{ConnectClient, MachineError, PingPongClient, Progress};
use super::proof::ConnectorHandshake;
use super::{
    limits, setup, ClientReport, ClientSpec, EngineConfig, EngineError, FlowOutcome, FlowWork,
};
use crate::rto::{self, Hysteresis, RetryTimeout};
use netgap_core::spec::{Mode, TransportOptions};
use netgap_core::stats::FlowHistogram;
use netgap_proto::dataproof::DataToken;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

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
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| sys("creating an epoll instance", e))?;
        let io = super::io::worker_io(cfg).map_err(|source| EngineError::Sys {
            what: format!("setting up the {} data path of a worker", cfg.path.name()),
            source,
        })?;
        workers.push(Worker {
            epoll,
            io,
            bufs: super::buffers::for_worker(spec.work, Side::Client, cfg, &gauge)?,
            flows: Vec::with_capacity(spec.flows / workers_n + 1),
            retries: RetryQueue::default(),
            rto: RetryTimeout::new(Hysteresis::None),
        });
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
        let (kind, interest) = match spec.work {
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
        w.flows.push(Flow {
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
        });
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
        let mut handles = Vec::with_capacity(workers.len());
        let mut starts = Vec::with_capacity(workers.len());
        for (w, worker) in workers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Schedule>();
            let abort = Arc::clone(&abort);
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

/// Runs one worker's flows from the start of warm-up until every flow has
/// stopped after the window.
fn run_worker(
    mut w: Worker,
    sched: Schedule,
    ctx: &Ctx,
    abort: &AtomicBool,
) -> Result<Vec<Finished>, EngineError> {
    let mut retries: VecDeque<(Instant, usize)> = VecDeque::new();
    let mut last_error: Option<String> = None;
    let now = Instant::now();
    for slot in 0..w.flows.len() {
        begin(&mut w, slot, now, sched, ctx, &mut retries, &mut last_error)?;
    }
    let mut events = vec![EpollEvent::empty(); 1024];
    let mut next_scan = now + Duration::from_millis(TICK_MS);
    loop {
        if abort.load(Ordering::Relaxed) {
            return Err(EngineError::Invalid(ABORTED.into()));
        }
        let now = Instant::now();
        let stopping = now >= sched.end;
        if stopping {
            // No new connection after the window.
            retries.clear();
            if !w.flows.iter().any(Flow::busy) {
                break;
            }
        }
        let mut wake = next_scan;
        if !stopping {
            wake = wake.min(sched.end);
        }
        if let Some(&(at, _)) = retries.front() {
            wake = wake.min(at);
        }
        if let Some(at) = w.retries.next_due() {
            wake = wake.min(at);
        }
        // Ahead of the rate budget: sleep it off (a tick at most, so the
        // timeouts, the schedule and the abort are still seen).
        super::io::wait_for_budget(ctx.rate.as_deref(), abort, Duration::from_millis(TICK_MS));
        let timeout_ms = wake
            .saturating_duration_since(now)
            .as_millis()
            .min(u128::from(TICK_MS));
        // Round up so the wake-up is not early and spinning; poll mode
        // spins on purpose.
        let timeout_ms = match ctx.mode {
            Mode::Event => u16::try_from(timeout_ms + 1).unwrap_or(u16::MAX),
            Mode::Poll => 0,
        };
        let n = match w.epoll.wait(&mut events, timeout_ms) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            let slot = ev.data() as usize;
            if slot < w.flows.len() {
                on_ready(&mut w, slot, sched, ctx, &mut retries, &mut last_error)?;
            }
            // The rest stay ready (level-triggered) for after the wait.
            if super::io::ahead(ctx.rate.as_deref()) {
                break;
            }
        }
        let now = Instant::now();
        resend_due(&mut w, now, ctx)?;
        while let Some(&(at, slot)) = retries.front() {
            if at > now {
                break;
            }
            retries.pop_front();
            begin(&mut w, slot, now, sched, ctx, &mut retries, &mut last_error)?;
        }
        if now >= next_scan {
            next_scan = now + Duration::from_millis(TICK_MS);
            for slot in 0..w.flows.len() {
                let f = &mut w.flows[slot];
                if !f.busy() || now.duration_since(f.last_progress) < ctx.io_timeout {
                    continue;
                }
                match &mut f.kind {
                    Kind::PingPong { .. } | Kind::Datagram { .. } => {
                        return Err(EngineError::FlowStalled {
                            index: f.index,
                            target: ctx.target,
                            timeout: ctx.io_timeout,
                        })
                    }
                    Kind::Connect { stream, .. } => {
                        *stream = None;
                        f.interest = None;
                        f.errors += 1;
                        last_error = Some(format!("no progress for {:?}", ctx.io_timeout));
                        if now < sched.end {
                            retries.push_back((now + RETRY_DELAY, slot));
                        }
                    }
                }
            }
        }
    }
    Ok(w.flows
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let (bytes_tx, bytes_rx, datagrams) = match &f.kind {
                Kind::PingPong { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, None),
                Kind::Connect { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, None),
                Kind::Datagram { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, Some(m.stats)),
            };
            Finished {
                index: f.index,
                completed: f.completed,
                // One copy per worker is enough to report the last failure.
                last_error: if i == 0 { last_error.take() } else { None },
                outcome: FlowOutcome {
                    index: f.index,
                    round_trips: f.round_trips,
                    bytes_tx,
                    bytes_rx,
                    window_bytes_tx: f.window_bytes_tx,
                    window_bytes_rx: f.window_bytes_rx,
                    hist: f.hist,
                    errors: f.errors,
                    datagrams,
                    window_setup_ns: f.window_setup_ns,
                },
            }
        })
        .collect())
}

/// Starts the flow's first exchange: a round trip, or a connection.
fn begin(
    w: &mut Worker,
    slot: usize,
    now: Instant,
    sched: Schedule,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) -> Result<(), EngineError> {
    match w.flows[slot].kind {
        Kind::Connect { .. } => {
            open_connection(w, slot, now, ctx, retries, last_error);
            return Ok(());
        }
        Kind::Datagram { .. } => return datagram_start(w, slot, now, ctx),
        Kind::PingPong { .. } => {}
    }
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let progress = m
        .start(&mut Io::new(stream.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    pingpong_advance(epoll, &mut **io, bufs, f, slot, progress, sched, ctx)
}

fn flow_failed(index: u32, ctx: &Ctx, e: MachineError) -> EngineError {
    EngineError::FlowFailed {
        index,
        target: ctx.target,
        reason: e.to_string(),
    }
}

/// Opens the next connection of a connect-mode flow; a failure is counted
/// and retried after [`RETRY_DELAY`].
fn open_connection(
    w: &mut Worker,
    slot: usize,
    now: Instant,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) {
    let f = &mut w.flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::Connect {
        stream,
        connecting,
        proof,
        timed,
        ..
    } = &mut f.kind
    else {
        return;
    };
    *proof = None;
    let opened = new_socket(ctx.target, ctx.bind_ip, ctx.transport, &ctx.options).and_then(|s| {
        s.set_nonblocking(true)?;
        match s.connect(&ctx.target.into()) {
            Ok(()) => Ok(s),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
            Err(e) => Err(e),
        }
    });
    match opened {
        Ok(s) => {
            let s: TcpStream = s.into();
            match w
                .epoll
                .add(&s, EpollEvent::new(EpollFlags::EPOLLOUT, slot as u64))
            {
                Ok(()) => {
                    f.interest = Some(EpollFlags::EPOLLOUT);
                    *stream = Some(s);
                    *connecting = true;
                    *timed = false;
                }
                Err(e) => {
                    f.errors += 1;
                    *last_error = Some(format!("adding a connection to epoll: {e}"));
                    retries.push_back((now + RETRY_DELAY, slot));
                }
            }
        }
        Err(e) => {
            f.errors += 1;
            *last_error = Some(e.to_string());
            retries.push_back((now + RETRY_DELAY, slot));
        }
    }
}

/// The latency from `t0` to `now`, ns.
fn elapsed_ns(t0: Instant, now: Instant) -> u64 {
    u64::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u64::MAX)
}

/// Handles readiness of the flow in `slot`.
fn on_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) -> Result<(), EngineError> {
    let reopen = match w.flows[slot].kind {
        Kind::PingPong { .. } => return pingpong_ready(w, slot, sched, ctx),
        Kind::Datagram { .. } => return datagram_ready(w, slot, sched, ctx),
        Kind::Connect { .. } => connect_ready(w, slot, sched, ctx, last_error),
    };
    match reopen {
        Reopen::No => {}
        Reopen::Now(now) => open_connection(w, slot, now, ctx, retries, last_error),
        Reopen::Later(now) => retries.push_back((now + RETRY_DELAY, slot)),
    }
    Ok(())
}

/// What a connect-mode flow does after an event.
enum Reopen {
    /// Nothing: the connection goes on, or the run is over.
    No,
    /// The connection finished: open the next one at once.
    Now(Instant),
    /// The connection failed: open the next one after [`RETRY_DELAY`].
    Later(Instant),
}

fn pingpong_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let progress = m
        .pump(&mut Io::new(stream.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    pingpong_advance(epoll, &mut **io, bufs, f, slot, progress, sched, ctx)
}

/// Acts on a pingpong flow's `progress`: records a finished round trip and
/// starts the next one (which on a fast path may itself finish at once, so
/// this loops), then sets the epoll interest to what the flow waits for.
#[allow(
    clippy::too_many_arguments,
    reason = "the worker's parts a flow's progress touches, borrowed apart from its flows"
)]
fn pingpong_advance(
    epoll: &Epoll,
    io: &mut dyn WorkerIo,
    bufs: &mut WorkerBuffers,
    f: &mut Flow,
    slot: usize,
    mut progress: Progress,
    sched: Schedule,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let want = loop {
        let now = Instant::now();
        f.last_progress = now;
        match progress {
            Progress::WantRead => break EpollFlags::EPOLLIN,
            Progress::WantWrite => break EpollFlags::EPOLLOUT,
            Progress::Done => {
                if sched.in_window(now) {
                    let size = m.size_bytes() as u64;
                    f.hist.record_ns(elapsed_ns(f.t0, now));
                    f.round_trips += 1;
                    f.window_bytes_tx += size;
                    f.window_bytes_rx += size;
                }
                if now >= sched.end {
                    // Finished: out of epoll, so that the server closing
                    // later is not taken for a failure.
                    let _ = epoll.delete(&*stream);
                    f.interest = None;
                    return Ok(());
                }
                f.t0 = now;
                progress = m
                    .start(&mut Io::new(stream.as_fd(), &mut *io), bufs)
                    .map_err(|e| flow_failed(f.index, ctx, e))?;
            }
        }
    };
    if f.interest != Some(want) {
        let mut ev = EpollEvent::new(want, slot as u64);
        epoll
            .modify(&*stream, &mut ev)
            .map_err(|e| sys("changing a flow's epoll interest", e))?;
        f.interest = Some(want);
    }
    // Level triggering brings the flow back when it is ready again.
    Ok(())
}

fn connect_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
    last_error: &mut Option<String>,
) -> Reopen {
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::Connect {
        stream,
        connecting,
        proof,
        timed,
        m,
    } = &mut f.kind
    else {
        return Reopen::No;
    };
    let Some(s) = stream.as_ref() else {
        return Reopen::No;
    };
    let now = Instant::now();
    let retry = |now: Instant| {
        if now < sched.end {
            Reopen::Later(now)
        } else {
            Reopen::No
        }
    };
    if *connecting {
        match s.take_error() {
            Ok(None) => {
                *connecting = false;
                f.setup_ns = elapsed_ns(f.t0, now);
                match &ctx.token {
                    Some(token) => match ConnectorHandshake::new(token) {
                        Ok(p) => *proof = Some(Box::new(p)),
                        Err(e) => {
                            *stream = None;
                            f.interest = None;
                            f.errors += 1;
                            *last_error = Some(format!("no random bytes for a nonce: {e}"));
                            return retry(now);
                        }
                    },
                    None => m.begin(),
                }
            }
            Ok(Some(e)) | Err(e) => {
                *stream = None;
                f.interest = None;
                f.errors += 1;
                *last_error = Some(e.to_string());
                return retry(now);
            }
        }
    }
    f.last_progress = now;
    // No request before the far end proved it belongs to the session.
    let result = match proof.as_mut().map(|p| p.pump(&mut &*s)) {
        None => m.pump(&mut Io::new(s.as_fd(), &mut **io), bufs),
        Some(Ok(Progress::Done)) => {
            *proof = None;
            m.begin();
            m.pump(&mut Io::new(s.as_fd(), &mut **io), bufs)
        }
        Some(Ok(waiting)) => Ok(waiting),
        Some(Err(e)) => {
            *stream = None;
            *proof = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(e.to_string());
            return retry(now);
        }
    };
    // While the proof runs, the machine still holds the last connection's
    // end: no reply of this one can have arrived.
    if !*timed && proof.is_none() && m.reply_received() {
        *timed = true;
        f.completed += 1;
        let now = Instant::now();
        if sched.in_window(now) {
            f.hist.record_ns(elapsed_ns(f.t0, now));
            f.round_trips += 1;
            f.window_setup_ns += f.setup_ns;
            let (request_bytes, reply_bytes) = m.sizes_bytes();
            f.window_bytes_tx += request_bytes as u64;
            f.window_bytes_rx += reply_bytes as u64;
        }
    }
    let want = match result {
        Ok(Progress::WantRead) => EpollFlags::EPOLLIN,
        Ok(Progress::WantWrite) => EpollFlags::EPOLLOUT,
        Ok(Progress::Done) => {
            // Closing after the server's end of stream leaves no TIME_WAIT
            // on this side.
            *stream = None;
            f.interest = None;
            let now = Instant::now();
            return if now < sched.end {
                Reopen::Now(now)
            } else {
                Reopen::No
            };
        }
        Err(e) => {
            *stream = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(e.to_string());
            return retry(Instant::now());
        }
    };
    if f.interest != Some(want) {
        let mut ev = EpollEvent::new(want, slot as u64);
        if let Err(e) = epoll.modify(s, &mut ev) {
            *stream = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(format!("changing a connection's epoll interest: {e}"));
            return retry(now);
        }
        f.interest = Some(want);
    }
    Reopen::No
}

/// Issues the next request of the datagram flow in `slot` and sets its
/// re-send deadline one retry timeout away.
fn datagram_start(w: &mut Worker, slot: usize, now: Instant, ctx: &Ctx) -> Result<(), EngineError> {
    let Worker {
        io,
        bufs,
        flows,
        retries,
        rto,
        ..
    } = w;
    let f = &mut flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::Datagram {
        socket,
        m,
        retry_at,
        backoff,
        queued,
    } = &mut f.kind
    else {
        return Ok(());
    };
    m.start(&mut Io::new(socket.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    *backoff = rto.get();
    let at = now + *backoff;
    *retry_at = Some(at);
    if !*queued {
        retries.push(at, slot);
        *queued = true;
    }
    Ok(())
}

/// Reads the replies of the datagram flow in `slot`: a finished round trip
/// is recorded (and teaches the retry timeout, if it needed no re-send) and
/// the next request issued, until the window is over.
fn datagram_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        rto,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::Datagram {
        socket,
        m,
        retry_at,
        backoff,
        ..
    } = &mut f.kind
    else {
        return Ok(());
    };
    let progress = m
        .pump(&mut Io::new(socket.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    if progress != Progress::Done {
        return Ok(());
    }
    let now = Instant::now();
    *retry_at = None;
    f.last_progress = now;
    if m.retried() {
        rto.back_off(*backoff);
    } else {
        rto.observe(now.duration_since(f.t0));
    }
    if sched.in_window(now) {
        let size = m.size_bytes() as u64;
        f.hist.record_ns(elapsed_ns(f.t0, now));
        f.round_trips += 1;
        f.window_bytes_tx += size;
        f.window_bytes_rx += size;
    }
    if now >= sched.end {
        // Finished: replies to earlier re-sends may still come, and are
        // nobody's business now.
        let _ = epoll.delete(&*socket);
        f.interest = None;
        return Ok(());
    }
    datagram_start(w, slot, now, ctx)
}

/// Sends again the requests whose retry deadline has passed, backing off
/// each (doubling up to the longest retry timeout), and re-queues flows
/// whose deadline moved on since their queue entry was made.
fn resend_due(w: &mut Worker, now: Instant, ctx: &Ctx) -> Result<(), EngineError> {
    while let Some(slot) = w.retries.pop_due(now) {
        let Some(f) = w.flows.get_mut(slot) else {
            continue;
        };
        let Kind::Datagram {
            socket,
            m,
            retry_at,
            backoff,
            queued,
        } = &mut f.kind
        else {
            continue;
        };
        *queued = false;
        let Some(at) = *retry_at else {
            continue;
        };
        let at = if at <= now {
            m.resend(&mut Io::new(socket.as_fd(), &mut *w.io), &mut w.bufs)
                .map_err(|e| flow_failed(f.index, ctx, e))?;
            *backoff = rto::backed_off(*backoff);
            let next = now + *backoff;
            *retry_at = Some(next);
            next
        } else {
            at
        };
        w.retries.push(at, slot);
        *queued = true;
    }
    Ok(())
}
