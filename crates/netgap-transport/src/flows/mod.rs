//! The flow engine: thousands of concurrent flows (data connections) served
//! by a few worker threads, each with its own epoll instance, instead of a
//! thread per flow. Multi-flow tests (`hotspot`, `connect`) run it inside
//! the agents: the server side is a [`FlowServer`], the client side is
//! [`prepare_clients`] (open every flow) followed by [`PreparedClients::run`]
//! (start every flow together after the coordinator's barrier, measure,
//! stop together, report per flow).
//!
//! Design:
//! - Each worker owns a fixed slice of the flows (flow `i` goes to worker
//!   `i % workers`) and one epoll instance; flows never move between
//!   workers, so a flow's state is touched by one thread only.
//! - Epoll is used level-triggered, and each flow's interest is exactly
//!   what its state machine waits for (readable *or* writable), changed
//!   with `EPOLL_CTL_MOD` only when that changes (a blocked write, a
//!   connect completing). Level triggering lets a worker stop pumping a flow
//!   at any point without losing a wake-up.
//! - Per-flow state machines (module `machine`) handle partial reads and writes
//!   over non-blocking sockets with TCP_NODELAY. They hold offsets and
//!   counters, not bytes: every flow of a worker sends from and reads into
//!   the worker's buffers (module `buffers`: a send and a receive buffer of
//!   the message size, at most 64 KiB in connect mode, at the point's
//!   `--align`/`--offset` layout), made with the worker, so a round trip
//!   allocates nothing and a 1-byte flow takes no page of its own. Only a
//!   server flow whose echo the socket held back gets a buffer of its own
//!   (its message size), which it keeps. Per-flow latencies go to a
//!   [`FlowHistogram`] (log-linear, percentiles within 1.6%, a few hundred
//!   bytes) so 100,000 of them stay small; the role's aggregate is their
//!   merge into one full-precision histogram.
//! - In connect mode the server closes first, so TIME_WAIT lands on the
//!   server and the client's ephemeral ports are free again at once.
//! - Completion mode: in `event` mode a worker sleeps in `epoll_wait` until
//!   a flow is ready; in `poll` mode it never sleeps, calling `epoll_wait`
//!   with a zero timeout in a loop (one core per worker spins).
//!
//! Transports: every transport whose [`crate::Transport::engine_path`]
//! gives a [`DataPath`]: the connections are TCP over IPv4 or IPv6, set up
//! with the transport's socket options, and the data path decides how their
//! bytes move (`tcp`: `read`/`write`; `uring`: io_uring operations). A
//! datagram path (`udp`, [`DataPath::datagrams`]) has no connections: each
//! pingpong flow is a UDP socket doing request/response with sequence
//! numbers and retries, and the server answers every flow of a worker from
//! one socket (module `datagram`); it carries no connect-mode work.

mod buffers;
mod client;
mod datagram;
pub mod io;
pub mod limits;
mod machine;
mod proof;
mod server;
pub mod setup;

pub use client::PreparedClients;
pub use io::{DataPath, WorkerIo, DATAGRAMS, SYSCALLS};
pub use limits::ensure_fd_limit;
pub use server::{bind_listener, FlowServer};

use crate::buffer::BufferLayout;
use netgap_core::datagram::DatagramStats;
use netgap_core::spec::{Mode, TransportOptions};
use netgap_core::stats::FlowHistogram;
use netgap_proto::dataproof::DataToken;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The largest pingpong message, in bytes: a server flow whose echo is
/// held back keeps a buffer of this size, so the cap keeps flows × size
/// within reason.
pub(crate) const MAX_PINGPONG_SIZE_BYTES: usize = 16 * 1024 * 1024;

/// What each flow does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowWork {
    /// hotspot: each flow is one connection running `size_bytes`-byte
    /// pingpong round trips back to back (`1..=MAX_PINGPONG_SIZE_BYTES`).
    PingPong {
        /// Message size each way, bytes.
        size_bytes: usize,
    },
    /// connect: each flow repeatedly opens a connection, sends
    /// `request_bytes`, reads `reply_bytes`, and closes; the server closes
    /// first so TIME_WAIT lands on the server, not on the client's
    /// ephemeral ports.
    Connect {
        /// Request size, bytes (may be 0).
        request_bytes: usize,
        /// Reply size, bytes (may be 0).
        reply_bytes: usize,
    },
}

impl FlowWork {
    /// The server side of one flow of this work.
    fn server_machine(&self) -> Box<dyn machine::ServerMachine> {
        match *self {
            FlowWork::PingPong { size_bytes } => Box::new(machine::EchoServer::new(size_bytes)),
            FlowWork::Connect {
                request_bytes,
                reply_bytes,
            } => Box::new(machine::ConnectServer::new(request_bytes, reply_bytes)),
        }
    }

    fn validate(&self, path: &dyn DataPath) -> Result<(), EngineError> {
        if path.datagrams() {
            match *self {
                FlowWork::PingPong { size_bytes } => datagram::check_size(size_bytes)?,
                FlowWork::Connect { .. } => {
                    return Err(EngineError::Invalid(format!(
                        "connect-mode flows set up a connection per exchange, and {} has no connections",
                        path.name()
                    )))
                }
            }
        }
        match *self {
            FlowWork::PingPong { size_bytes: 0 } => {
                Err(EngineError::Invalid("pingpong flows need a message size of at least 1 byte".into()))
            }
            FlowWork::PingPong { size_bytes } if size_bytes > MAX_PINGPONG_SIZE_BYTES => {
                Err(EngineError::Invalid(format!(
                    "pingpong message size {size_bytes} bytes is over the engine's limit of {MAX_PINGPONG_SIZE_BYTES} bytes"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// How the engine runs.
#[derive(Clone)]
pub struct EngineConfig {
    /// Worker threads, each with its own epoll instance; at least 1.
    pub workers: usize,
    /// How long a flow may make no progress mid-exchange (and how long a
    /// connect may take) before it is an error; also how long in-flight
    /// exchanges may take to finish after the run's end. Must be non-zero.
    pub io_timeout: Duration,
    /// `event`: workers sleep in epoll; `poll`: they spin on it.
    pub mode: Mode,
    /// Socket options of every connection; those that act on each message
    /// of a single flow are refused (see [`check_options`]).
    pub options: TransportOptions,
    /// How the workers move bytes: the transport's data path.
    pub path: &'static dyn DataPath,
    /// The point's session token: with one, every connection proves both
    /// ends hold it right after connect and accept, before any payload
    /// (`netgap_proto::dataproof`), and a server drops connections that do
    /// not. `None` (an engine inside one test process) skips the proof.
    /// A datagram path proves it in each flow's opening datagrams, and its
    /// server serves no flow that did not.
    pub token: Option<DataToken>,
    /// The rate budget every byte the workers move is charged to (an
    /// agent's `--max-rate`, shared with its other flows); a worker ahead
    /// of it waits before it moves more. `None`: unpaced.
    pub rate: Option<std::sync::Arc<crate::rate::RateBudget>>,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("workers", &self.workers)
            .field("io_timeout", &self.io_timeout)
            .field("mode", &self.mode)
            .field("options", &self.options)
            .field("path", &self.path.name())
            .field("token", &self.token.is_some())
            .field("rate_gbps", &self.rate.as_ref().map(|r| r.rate_gbps()))
            .finish()
    }
}

impl EngineConfig {
    /// `workers` workers over plain system calls (`tcp`), event mode,
    /// default socket options.
    pub fn tcp(workers: usize, io_timeout: Duration) -> EngineConfig {
        EngineConfig {
            workers,
            io_timeout,
            mode: Mode::Event,
            options: TransportOptions::default(),
            path: &SYSCALLS,
            token: None,
            rate: None,
        }
    }

    /// Where the workers' message buffers start (`--align`, `--offset`).
    fn buffer_layout(&self) -> Result<BufferLayout, EngineError> {
        BufferLayout::of_options(&self.options)
            .map_err(|e| EngineError::Invalid(format!("message buffers: {e}")))
    }

    fn validate(&self) -> Result<(), EngineError> {
        check_options(&self.options)?;
        self.buffer_layout()?;
        if self.workers == 0 {
            return Err(EngineError::Invalid(
                "the flow engine needs at least 1 worker".into(),
            ));
        }
        if self.io_timeout.is_zero() {
            return Err(EngineError::Invalid(
                "the flow engine's I/O timeout must be more than 0".into(),
            ));
        }
        Ok(())
    }
}

/// The options set in `options` that act on each message of a single flow
/// (`--zerocopy`, `--cork`, `--quickack`, `--sqpoll`): the engine does not
/// apply them, so a run that sets them is refused.
pub fn per_message_options(options: &TransportOptions) -> Vec<&'static str> {
    [
        ("--zerocopy", options.zerocopy),
        ("--cork", options.cork),
        ("--quickack", options.quickack),
        ("--sqpoll", options.sqpoll),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect()
}

/// Refuses the options the engine does not apply ([`per_message_options`]).
pub fn check_options(options: &TransportOptions) -> Result<(), EngineError> {
    let refused = per_message_options(options);
    if refused.is_empty() {
        return Ok(());
    }
    Err(EngineError::Invalid(format!(
        "{} act on each message of a single flow and the multi-client flow engine does not apply them; drop them for this test",
        refused.join(", ")
    )))
}

/// What a [`FlowServer`] moved, over its whole life, all workers together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTotals {
    /// Payload bytes read from clients.
    pub bytes_rx: u64,
    /// Payload bytes written to clients.
    pub bytes_tx: u64,
    /// Connections accepted; on a datagram path, flows that said hello.
    pub connections_accepted: u64,
    /// Connections that ended cleanly: the client closed between pingpong
    /// messages, or a connect-mode reply was fully written.
    pub connections_completed: u64,
    /// Connections that ended with an error (reset, closed mid-exchange),
    /// plus failed accepts (e.g. out of descriptors); on a datagram path,
    /// datagrams dropped as not netgap's, of the wrong size, or from a flow
    /// that never proved the session (without a token: never said hello),
    /// or one past the worker's cap.
    pub errors: u64,
    /// Connections closed before their role began because they did not
    /// prove they belong to the session (a stranger, a port scan, another
    /// point's client); also counted in `errors`. On a datagram path with
    /// a token: datagrams dropped, unanswered, because their sender has not
    /// proven the session (hellos and confirmations that fail the proof,
    /// data from an address whose confirmation never verified).
    pub strangers: u64,
    /// The datagram counters of a datagram path, all flows together;
    /// `None` for connections.
    pub datagrams: Option<DatagramStats>,
}

impl ServerTotals {
    fn add(&mut self, o: &ServerTotals) {
        self.bytes_rx += o.bytes_rx;
        self.bytes_tx += o.bytes_tx;
        self.connections_accepted += o.connections_accepted;
        self.connections_completed += o.connections_completed;
        self.errors += o.errors;
        self.strangers += o.strangers;
        self.datagrams = match (self.datagrams, o.datagrams) {
            (Some(a), Some(b)) => Some(a.plus(&b)),
            (a, b) => a.or(b),
        };
    }
}

/// The client side's flows: all go to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSpec {
    /// The [`FlowServer`]'s address.
    pub target: SocketAddr,
    /// Concurrent flows; at least 1.
    pub flows: usize,
    /// What each flow does; must match the server's.
    pub work: FlowWork,
    /// Local address to bind every connection to (port chosen by the
    /// system), e.g. to pick a link; `None` lets routing choose.
    pub bind_ip: Option<IpAddr>,
}

/// Open every flow of `spec` and get ready (phase 1 of a client): for
/// PingPong over connections, connect all of them, at most
/// [`setup::CONNECT_WINDOW`] in setup at once, each connected (and, with a
/// token, proven) within `cfg.io_timeout`; for Connect, nothing to open yet. Raises the
/// descriptor limit as needed and checks the ephemeral port range; nothing
/// is sent until [`PreparedClients::run`].
pub fn prepare_clients(
    spec: &ClientSpec,
    cfg: &EngineConfig,
) -> Result<PreparedClients, EngineError> {
    client::prepare(spec, cfg)
}

/// The client side's results.
#[derive(Debug, Clone)]
pub struct ClientReport {
    /// One outcome per flow, in flow order (`flows[i].index == i`).
    pub flows: Vec<FlowOutcome>,
    /// The measured window (after warm-up, until the stop), ns. Round trips
    /// and connections are counted when they complete inside it.
    pub elapsed_ns: u64,
}

/// One flow's results.
#[derive(Debug, Clone)]
pub struct FlowOutcome {
    /// The flow's number, `0..flows`.
    pub index: u32,
    /// Round trips (PingPong) or connections (Connect: reply received)
    /// completed inside the measured window.
    pub round_trips: u64,
    /// Bytes written over the whole run (warm-up and the finish of in-flight
    /// exchanges after the window included), so that the sum over flows
    /// equals what the server read.
    pub bytes_tx: u64,
    /// Bytes read over the whole run (as `bytes_tx`).
    pub bytes_rx: u64,
    /// Payload bytes sent by the exchanges counted in `round_trips`.
    pub window_bytes_tx: u64,
    /// Payload bytes received by the exchanges counted in `round_trips`.
    pub window_bytes_rx: u64,
    /// Latency of each exchange counted in `round_trips`, ns: the round trip
    /// (PingPong) or connection setup, session proof (with a token), request
    /// and reply (Connect).
    /// A [`FlowHistogram`]: a few hundred bytes, percentiles within 1.6%.
    pub hist: FlowHistogram,
    /// Failed connections (refused, no local address, reset, stalled past
    /// the I/O timeout) in Connect mode over the whole run; always 0 for
    /// PingPong, where a failure ends the run with an error instead.
    pub errors: u64,
    /// The flow's datagram counters on a datagram path, whole run; `None`
    /// for a connection.
    pub datagrams: Option<DatagramStats>,
    /// Connect: the connection setup time (from opening the socket to the
    /// connection being established, as the client sees it) of the
    /// connections counted in `round_trips`, summed, ns; 0 otherwise.
    pub window_setup_ns: u64,
}

/// Why the engine failed. Messages name the flow and the target where
/// there is one.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Parameters the engine cannot run.
    #[error("{0}")]
    Invalid(String),
    /// The listener could not be set up.
    #[error("binding the flow server to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A system call the engine depends on failed (epoll, threads).
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Reading or changing a resource limit failed.
    #[error("{what}: {source}")]
    Limit {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The hard descriptor limit is below what the flows need.
    #[error(
        "{needed} file descriptors are needed but the limit is {soft} (hard limit {hard}); \
         raise it with `ulimit -n {needed}` (as root, or raise the hard limit in \
         /etc/security/limits.conf) before starting netgap, or set LimitNOFILE={needed} \
         in the service unit"
    )]
    TooFewDescriptors {
        /// Descriptors needed, flows plus spare.
        needed: u64,
        /// Soft limit in force.
        soft: u64,
        /// Hard limit in force.
        hard: u64,
    },
    /// More concurrent connections to one target than ephemeral ports.
    #[error(
        "{concurrent} concurrent connections to {target} need {concurrent} local ports but \
         net.ipv4.ip_local_port_range ({low}-{high}) gives {ports}; widen it, e.g. \
         `sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"`, or use fewer flows per client host"
    )]
    TooFewPorts {
        /// Connections asked for.
        concurrent: u64,
        /// Ports in the range.
        ports: u64,
        /// Lowest port of the range.
        low: u32,
        /// Highest port of the range.
        high: u32,
        /// The target.
        target: SocketAddr,
    },
    /// Opening a pingpong flow failed.
    #[error("opening flow {index} to {target}: {source}")]
    Connect {
        /// The flow.
        index: u32,
        /// The target.
        target: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A flow failed mid-run (the peer closed, reset, or sent garbage).
    #[error("flow {index} to {target} failed: {reason}")]
    FlowFailed {
        /// The flow.
        index: u32,
        /// The target.
        target: SocketAddr,
        /// What happened.
        reason: String,
    },
    /// A flow made no progress within the I/O timeout.
    #[error(
        "flow {index} to {target} made no progress for {timeout:?}; the server is gone or stuck"
    )]
    FlowStalled {
        /// The flow.
        index: u32,
        /// The target.
        target: SocketAddr,
        /// The I/O timeout.
        timeout: Duration,
    },
    /// Not one connection of any flow succeeded.
    #[error(
        "every one of {flows} flows to {target} failed ({errors} failed connections; last: {last})"
    )]
    AllFlowsFailed {
        /// Flows run.
        flows: usize,
        /// The target.
        target: SocketAddr,
        /// Failed connections.
        errors: u64,
        /// The last failure seen.
        last: String,
    },
    /// A worker thread panicked; a bug, not a peer's doing.
    #[error("a flow worker thread panicked")]
    WorkerPanicked,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
