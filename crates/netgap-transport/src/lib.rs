//! How bytes move between two endpoints. Every test runs unchanged over every
//! [`Transport`] in the [`registry`]: a transport opens a [`Listener`] on the
//! agent's side and connects a [`Flow`] from the coordinator's side; a flow
//! splits into a [`Sender`] and a [`Receiver`] half so a test can send and
//! receive at the same time from two threads.
//!
//! Adding a transport is one new module here plus one line in [`registry`].
//!
//! This crate is the data path: the transports, the multi-client flow
//! engine ([`flows`]), and the readings of the local host that go with a
//! measurement ([`cpu`], [`host`], [`affinity`]). It knows nothing of the
//! control protocol or of how results are reported.

pub mod affinity;
pub mod buffer;
pub mod cpu;
pub mod flows;
pub mod host;
pub mod mptcp;
pub mod netns;
pub mod options;
pub mod preamble;
pub mod random;
pub mod rate;
pub mod rto;
pub mod shm;
mod sockdir;
mod sockopt;
mod stream_socket;
pub mod tcp;
pub mod udp;
pub mod unix;
pub mod uring;
pub mod xdp;
mod zerocopy;

pub use netgap_core::framing::Framing;
use netgap_core::spec::{Mode, PointSpec, TransportOptions};

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// Why a data-path operation failed. Never panics on peer behaviour.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// The peer closed the flow (EOF, reset, broken pipe).
    #[error("peer closed the connection")]
    Closed,
    /// No progress for the whole inactivity timeout.
    #[error("no data moved for {timeout_ms} ms (peer hung or gone)")]
    TimedOut {
        /// The inactivity timeout that expired, in milliseconds.
        timeout_ms: u128,
    },
    /// A byte arrived that is not the one sent (`--verify`).
    #[error("payload corrupted at stream offset {offset_bytes}: expected {expected:#04x}, got {got:#04x}")]
    Corrupt {
        /// Offset of the bad byte in the flow's byte stream.
        offset_bytes: u64,
        /// The byte that was sent.
        expected: u8,
        /// The byte that arrived.
        got: u8,
    },
    /// A message larger than the transport carries (one datagram).
    #[error(
        "a {size_bytes}-byte message is larger than the {max_bytes} bytes this transport carries"
    )]
    TooLarge {
        /// Size of the refused message, in bytes.
        size_bytes: u64,
        /// Largest message the transport carries, in bytes.
        max_bytes: u64,
    },
    /// Any other I/O error.
    #[error("{0}")]
    Io(io::Error),
}

impl FlowError {
    /// Classifies an I/O error from the data path.
    pub fn from_io(e: io::Error, timeout: Duration) -> FlowError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FlowError::TimedOut {
                timeout_ms: timeout.as_millis(),
            },
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => FlowError::Closed,
            _ => FlowError::Io(e),
        }
    }
}

/// Why a transport could not listen or connect.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Opening the data listener failed.
    #[error("cannot open a {transport} data listener: {source}")]
    Listen {
        /// Transport name.
        transport: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// Connecting to the peer's data listener failed.
    #[error("cannot connect the {transport} data flow to {addr}: {source}")]
    Connect {
        /// Transport name.
        transport: &'static str,
        /// Address connected to.
        addr: String,
        /// Underlying error.
        source: io::Error,
    },
    /// The peer did not connect in time.
    #[error("no {transport} data connection arrived within {timeout_ms} ms")]
    AcceptTimeout {
        /// Transport name.
        transport: &'static str,
        /// How long the listener waited, in milliseconds.
        timeout_ms: u128,
    },
    /// The address sent by the peer cannot be used by this transport.
    #[error("bad {transport} address {addr:?}: {detail}")]
    BadAddress {
        /// Transport name.
        transport: &'static str,
        /// The address.
        addr: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The transport cannot do what was asked of it.
    #[error("{transport} cannot {what}")]
    Unsupported {
        /// Transport name.
        transport: &'static str,
        /// What it cannot do, as a verb phrase.
        what: &'static str,
    },
    /// Applying a socket option failed.
    #[error("cannot set {option} on the {transport} data flow: {source}")]
    Option {
        /// Transport name.
        transport: &'static str,
        /// Option name (`TCP_NODELAY`, `SO_SNDBUF`, ...).
        option: &'static str,
        /// Underlying error.
        source: io::Error,
    },
}

/// The sending half of a flow.
pub trait Sender: Send {
    /// Sends some of `buf`, returning how many bytes (at least 1) went out.
    /// Blocks or spins according to the flow's mode; fails after the
    /// inactivity timeout.
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError>;

    /// Sends all of `buf`.
    fn send_all(&mut self, mut buf: &[u8]) -> Result<(), FlowError> {
        while !buf.is_empty() {
            let n = self.send_some(buf)?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// Marks the end of a burst: the caller sends nothing more until it has
    /// heard from the peer or the repetition is over. An unreliable flow
    /// tells the peer where the burst ended, so a lost tail is asked for at
    /// once; a no-op for a reliable flow.
    fn end_burst(&mut self) -> Result<(), FlowError> {
        Ok(())
    }
}

/// The receiving half of a flow.
pub trait Receiver: Send {
    /// Receives some bytes into `buf` (non-empty), returning how many (at
    /// least 1). The peer closing the flow is [`FlowError::Closed`].
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError>;

    /// Fills all of `buf`.
    fn recv_exact(&mut self, mut buf: &mut [u8]) -> Result<(), FlowError> {
        while !buf.is_empty() {
            let n = self.recv_some(buf)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// Receives and discards exactly `total_bytes`, using `scratch` (non-empty)
    /// as the landing buffer. On an unreliable flow, bytes counted lost
    /// count toward `total_bytes` too.
    fn recv_discard(&mut self, mut total_bytes: u64, scratch: &mut [u8]) -> Result<(), FlowError> {
        while total_bytes > 0 {
            let want = scratch
                .len()
                .min(usize::try_from(total_bytes).unwrap_or(usize::MAX));
            let lost0 = self.lost_bytes();
            let n = self.recv_some(&mut scratch[..want])?;
            let lost = self.lost_bytes().saturating_sub(lost0);
            total_bytes = total_bytes.saturating_sub(n as u64 + lost);
        }
        Ok(())
    }

    /// Payload bytes this receiver skipped since the flow opened because
    /// their datagrams were lost: always 0 on a reliable flow. It grows just
    /// before a [`Receiver::recv_some`] returns the bytes after the gap.
    fn lost_bytes(&self) -> u64 {
        0
    }

    /// Bytes that have arrived and wait to be received (FIONREAD on a
    /// socket), so a caller can time a receive of data already there
    /// (logp's receive overhead); `None` when the transport cannot tell.
    fn ready_bytes(&self) -> Option<u64> {
        None
    }
}

/// One data connection between two endpoints.
pub trait Flow: Send {
    /// Both halves at once, so a test can send from one thread while it
    /// receives on another.
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver);

    /// Both halves, owned: for a test that keeps a helper thread sending for
    /// a whole point while it receives on its own thread.
    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>);

    /// The socket that carries the flow's data, if one socket does: what
    /// the default [`Flow::abort_handle`] shuts down. `None` by default.
    fn data_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// A handle that ends this flow from another thread. By default it
    /// shuts down the socket of [`Flow::data_fd`]; a transport whose loops
    /// a shutdown would not wake (shared memory, datagrams) gives its own.
    /// `None` when the flow cannot be ended from outside.
    fn abort_handle(&self) -> Option<AbortHandle> {
        let fd = self.data_fd()?.try_clone_to_owned().ok()?;
        Some(AbortHandle::new(Arc::new(SocketAbort(fd))))
    }

    /// Sends all of `buf`.
    fn send_all(&mut self, buf: &[u8]) -> Result<(), FlowError> {
        self.split().0.send_all(buf)
    }

    /// Fills all of `buf`.
    fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), FlowError> {
        self.split().1.recv_exact(buf)
    }

    /// A handle that outlives the test's ownership of the flow, for a
    /// flow over datagrams whose counts (lost, sent again, dropped) the
    /// record carries; `None` for a kernel byte stream.
    fn monitor(&self) -> Option<Arc<dyn FlowMonitor>> {
        None
    }

    /// Whether every byte sent arrives, in order: a test may then wait for
    /// a peer's first message without the risk that it was lost. A flow
    /// over datagrams is not, unless it delivers reliably on its own (xdp
    /// sends again what was lost).
    fn reliable(&self) -> bool {
        self.monitor().is_none()
    }

    /// How this flow's data path was set up where the transport had a
    /// choice the user did not make, as `name=value` entries for the
    /// record's stack (xdp: the hook its program attached to). Two flows
    /// whose entries differ are different stacks. Empty by default.
    fn path_choices(&self) -> Vec<String> {
        Vec::new()
    }

    /// Takes the key the session's data proof gave this flow
    /// ([`netgap_proto::dataproof::FlowKey`]), as soon as this end knows
    /// the far end holds the point's token: a transport that carries its
    /// own frames (xdp) authenticates every frame from then on. Nothing by
    /// default: a kernel stack's flows are the kernel's to protect.
    fn bind_session(&mut self, key: &netgap_proto::dataproof::FlowKey) -> Result<(), FlowError> {
        let _ = key;
        Ok(())
    }
}

pub use netgap_core::datagram::DatagramStats;

/// How a transport ends one of its flows from another thread (see
/// [`AbortHandle`]).
pub trait Abort: Send + Sync {
    /// Ends the flow: a send or receive blocked on it wakes and fails at
    /// once, every later call fails, and the peer sees the flow end.
    fn abort(&self);
}

/// Ends a flow from another thread, whatever its transport: a receive or
/// send blocked on it wakes and fails at once, and every later call fails.
/// An agent uses it to stop a repetition that runs past its
/// `--max-duration`. Clones end the same flow.
#[derive(Clone)]
pub struct AbortHandle(Arc<dyn Abort>);

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

impl AbortHandle {
    /// A handle that ends a flow the way `how` does.
    pub fn new(how: Arc<dyn Abort>) -> AbortHandle {
        AbortHandle(how)
    }

    /// Ends the flow.
    pub fn abort(&self) {
        self.0.abort();
    }

    /// A handle that calls `abort` on `target` while the flow that owns it
    /// lives; once the flow is gone there is nothing to end.
    pub(crate) fn weak<T: Send + Sync + 'static>(
        target: std::sync::Weak<T>,
        abort: fn(&T),
    ) -> AbortHandle {
        AbortHandle(Arc::new(WeakAbort { target, abort }))
    }
}

/// Ends a flow through the state its halves share, held weakly.
struct WeakAbort<T> {
    target: std::sync::Weak<T>,
    abort: fn(&T),
}

impl<T: Send + Sync> Abort for WeakAbort<T> {
    fn abort(&self) {
        if let Some(t) = self.target.upgrade() {
            (self.abort)(&t);
        }
    }
}

/// The error of a flow call after its flow was ended by an
/// [`AbortHandle`].
pub fn aborted() -> FlowError {
    FlowError::Io(io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the flow was ended by this end",
    ))
}

/// Ends a flow whose data goes over one socket by shutting that socket
/// down in both directions: the kernel wakes its blocked calls and fails
/// every later one, and a stream peer sees the end.
struct SocketAbort(std::os::fd::OwnedFd);

impl Abort for SocketAbort {
    fn abort(&self) {
        use std::os::fd::AsRawFd;
        let _ = nix::sys::socket::shutdown(self.0.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

/// A handle that ends `flow` from another thread ([`Flow::abort_handle`]);
/// `None` if the flow cannot be ended from outside.
pub fn abort_handle(flow: &dyn Flow) -> Option<AbortHandle> {
    flow.abort_handle()
}

/// What the runner (client end) and the agent (server end) keep of an
/// unreliable flow while a test owns it: its counters, and the upkeep that
/// lets a peer recover a repetition's lost last datagram.
pub trait FlowMonitor: Send + Sync {
    /// The flow's counters since it connected.
    fn datagram_stats(&self) -> DatagramStats;

    /// What the `dropped` of [`FlowMonitor::datagram_stats`] counts for,
    /// when flows share it: flows with the same scope report the same
    /// drops (xdp's are its port's), so a total counts them once. `None`:
    /// the flow's own (a udp socket's).
    fn drops_scope(&self) -> Option<u64> {
        None
    }

    /// While the test is idle, answers the peer's retries (and keeps asking
    /// whether the peer got this end's last burst) until `wake` is readable
    /// (the control connection has a message) or `max_wait` passes. Never
    /// delivers data: new data stays queued for the test. An error means the
    /// flow broke; the next repetition reports it.
    fn serve_idle(&self, wake: BorrowedFd<'_>, max_wait: Duration) -> Result<(), FlowError>;
}

/// The counters of several flows together (a workload role's): their
/// sums, with the drops of each shared scope counted once; `None` for no
/// flows.
pub fn total_datagrams(monitors: &[Arc<dyn FlowMonitor>]) -> Option<DatagramStats> {
    if monitors.is_empty() {
        return None;
    }
    let mut total = DatagramStats::default();
    // Each shared scope's drops, as the flow that read them last saw them
    // (a later read has counted at least as many).
    let mut scopes: Vec<(u64, u64)> = Vec::new();
    for m in monitors {
        let d = m.datagram_stats();
        let own = match m.drops_scope() {
            None => d.dropped,
            Some(scope) => {
                match scopes.iter_mut().find(|(s, _)| *s == scope) {
                    Some((_, seen)) => *seen = (*seen).max(d.dropped),
                    None => scopes.push((scope, d.dropped)),
                }
                0
            }
        };
        total = total.plus(&DatagramStats { dropped: own, ..d });
    }
    total.dropped = scopes
        .iter()
        .fold(total.dropped, |sum, (_, seen)| sum.saturating_add(*seen));
    Some(total)
}

/// Waits for the one flow of a point.
pub trait Listener: Send {
    /// The address the peer connects to, as sent in the control protocol.
    fn addr(&self) -> String;

    /// Accepts one flow, waiting at most `timeout`.
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError>;
}

/// What a flow needs to know, on either end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowConfig {
    /// Completion mode.
    pub mode: Mode,
    /// Socket options.
    pub options: TransportOptions,
    /// Data-path inactivity timeout.
    pub io_timeout: Duration,
}

impl FlowConfig {
    /// The flow configuration of a point.
    pub fn from_spec(spec: &PointSpec) -> FlowConfig {
        FlowConfig {
            mode: spec.mode,
            options: spec.options.clone(),
            io_timeout: Duration::from_millis(u64::from(spec.io_timeout_ms)),
        }
    }
}

/// What a transport can do, shown by `netgap list` and used to skip
/// combinations that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Delivers every byte, in order.
    pub reliable: bool,
    /// Preserves message boundaries.
    pub message_boundaries: bool,
    /// Can connect two different hosts.
    pub cross_host: bool,
    /// Completion modes supported.
    pub modes: &'static [Mode],
    /// The options the transport honours, each declared once (see
    /// [`options`]); the plan refuses any other option given, rather than
    /// record an option that had no effect.
    pub options: &'static [&'static options::OptionDecl],
    /// Both ends may sit on one host (loopback); `false` for a transport
    /// that needs an interface of its own at each end.
    pub runs_on_loopback: bool,
    /// Its listeners' addresses are `IP:PORT`, as the multi-host workloads
    /// that compose their flows' targets themselves need; `false` for a
    /// transport with addresses of its own (xdp's `IP/MAC/FLOW`), which
    /// those workloads refuse. Workloads that dial only what listeners
    /// announced take any form, through [`Transport::parse_listen_addr`].
    pub ip_port_addresses: bool,
    /// [`Transport::connect_from`] works: a workload run then picks the
    /// link each flow takes by its local address.
    pub binds_local: bool,
    /// How unmodified programs (real servers, load generators) run over
    /// it.
    pub programs: Programs,
    /// How it puts payload into frames on a link, which every record's
    /// stack carries for the physics of its path; `None` for a transport
    /// that crosses no link (one host's unix sockets, shared memory).
    pub framing: Option<Framing>,
}

/// How unmodified programs (nginx, gmond, wrk) run over a transport: the
/// workloads that start real programs, and `netgap wrap`, ask this rather
/// than a transport's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Programs {
    /// They cannot: the transport is netgap's own.
    No,
    /// As they are, on the kernel's sockets.
    Kernel,
    /// Under netgap's sockets library (`netgap wrap`), between the
    /// programs of one host.
    Library,
    /// Under netgap's sockets library, across hosts through each host's
    /// relay (`netgap relay`), which holds the transport's side.
    LibraryWithRelay,
}

impl Programs {
    /// Whether programs run under netgap's sockets library.
    pub fn under_library(self) -> bool {
        matches!(self, Programs::Library | Programs::LibraryWithRelay)
    }
}

impl Capabilities {
    /// A reliable byte stream that connects two hosts, in every completion
    /// mode (tcp and the transports built on it), honouring `options`.
    pub const fn cross_host_stream(
        options: &'static [&'static options::OptionDecl],
    ) -> Capabilities {
        Capabilities {
            reliable: true,
            message_boundaries: false,
            cross_host: true,
            modes: &Mode::ALL,
            options,
            runs_on_loopback: true,
            ip_port_addresses: true,
            binds_local: false,
            programs: Programs::No,
            framing: None,
        }
    }

    /// A reliable byte stream within one host, in every completion mode
    /// (unix sockets, shared memory), honouring `options`.
    pub const fn local_stream(options: &'static [&'static options::OptionDecl]) -> Capabilities {
        Capabilities {
            cross_host: false,
            ..Capabilities::cross_host_stream(options)
        }
    }
}

/// Why a transport cannot be used on this host, in one line with the
/// remedy where there is one (probed at run time: a kernel feature, a
/// sandbox).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// Where a listener is reached, as its transport names it, parsed once:
/// the IP of the host it is on (which a multi-host workload checks
/// against the session's hosts) and the text the transport's
/// [`Transport::connect`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    ip: std::net::IpAddr,
    text: String,
}

impl ListenAddr {
    /// An address of host `ip` written `text` (as the transport's parser
    /// found it).
    pub fn new(ip: std::net::IpAddr, text: String) -> ListenAddr {
        ListenAddr { ip, text }
    }

    /// The listener's host.
    pub fn ip(&self) -> std::net::IpAddr {
        self.ip
    }

    /// The address as the transport's `connect` takes it.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A way to move bytes; one module per transport, one line in [`registry`].
pub trait Transport: Sync {
    /// Name used on the command line and in results.
    fn name(&self) -> &'static str;
    /// One line for `netgap list`.
    fn summary(&self) -> &'static str;
    /// What the transport can do.
    fn capabilities(&self) -> Capabilities;
    /// `Ok` when the transport works on this host, else why not.
    fn availability(&self) -> Result<(), Unavailable> {
        Ok(())
    }
    /// Largest message the transport carries, in bytes, when it has a
    /// limit (a datagram); the plan refuses larger sizes.
    fn max_message_bytes(&self) -> Option<u64> {
        None
    }
    /// Opens the data listener for one point on the agent's side. `local_ip`
    /// is the address the control connection arrived on.
    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: std::net::IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError>;
    /// Connects to the listener at `addr` on the coordinator's side.
    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError>;

    /// Memory one flow of this transport commits on each end beyond the
    /// point's message buffers, in bytes: registered memory and rings a
    /// user-level transport keeps for the flow's life. The agent counts it
    /// against its budget before it opens the flow; a kernel socket's
    /// buffers are the kernel's and count as 0 here.
    fn flow_memory_bytes(&self) -> u64 {
        0
    }

    /// Parses what one of its listeners announced ([`Listener::addr`]):
    /// `IP:PORT`, unless the transport has a form of its own.
    fn parse_listen_addr(&self, addr: &str) -> Result<ListenAddr, ListenAddrError> {
        let sa: std::net::SocketAddr = addr
            .parse()
            .map_err(|_| ListenAddrError::NotIpPort(addr.to_string()))?;
        Ok(ListenAddr::new(sa.ip(), sa.to_string()))
    }

    /// Connects to `addr` from the local address `local_ip` (port chosen
    /// by the system). Refused unless [`Capabilities::binds_local`].
    fn connect_from(
        &self,
        config: &FlowConfig,
        addr: &str,
        local_ip: std::net::IpAddr,
    ) -> Result<Box<dyn Flow>, TransportError> {
        let _ = (config, addr, local_ip);
        Err(TransportError::Unsupported {
            transport: self.name(),
            what: "connect a flow from a chosen local address",
        })
    }

    /// How the multi-client flow engine ([`flows`]) moves this transport's
    /// bytes, or `None` when the engine cannot carry it (a transport without
    /// connections, or one that cannot cross hosts).
    fn engine_path(&self) -> Option<&'static dyn flows::DataPath> {
        None
    }
}

/// Why what a listener announced is no address of its transport
/// ([`Transport::parse_listen_addr`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenAddrError {
    /// Not `IP:PORT`, the form of every transport without one of its own.
    #[error("{0:?} is not IP:PORT")]
    NotIpPort(String),
    /// Not an xdp address, `IP/MAC/FLOW`.
    #[error("{addr:?}: {source}")]
    Xdp {
        /// The address as announced.
        addr: String,
        /// What is wrong with it.
        source: xdp::AddrError,
    },
}

/// Every transport netgap has, in the order `netgap list` shows them.
pub fn registry() -> &'static [&'static dyn Transport] {
    &[
        &tcp::Tcp,
        &unix::Unix,
        &uring::Uring,
        &shm::Shm,
        &udp::Udp,
        &mptcp::Mptcp,
        &xdp::Xdp,
    ]
}

/// The transport called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn Transport> {
    netgap_core::registry::find(registry(), name)
}

/// Names of all transports, comma separated, for error messages.
pub fn names() -> String {
    netgap_core::registry::names(registry())
}

/// How unmodified programs run over the transport called `name`
/// ([`Programs::No`] for a name netgap does not know).
pub fn programs(name: &str) -> Programs {
    find(name).map_or(Programs::No, |t| t.capabilities().programs)
}

/// How the transport `name` frames its payload on a link, which a
/// record's stack carries; `None` for one that crosses no link or an
/// unknown name.
pub fn framing(name: &str) -> Option<Framing> {
    find(name).and_then(|t| t.capabilities().framing)
}

/// The transports unmodified programs run over, for error messages: "tcp,
/// shm or xdp".
pub fn program_transports() -> String {
    let names: Vec<&str> = registry()
        .iter()
        .filter(|t| t.capabilities().programs != Programs::No)
        .map(|t| t.name())
        .collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl netgap_core::registry::Named for dyn Transport {
    fn name(&self) -> &'static str {
        Transport::name(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    /// A monitor with fixed counters and drops scope.
    struct Fixed(DatagramStats, Option<u64>);

    impl FlowMonitor for Fixed {
        fn datagram_stats(&self) -> DatagramStats {
            self.0
        }
        fn drops_scope(&self) -> Option<u64> {
            self.1
        }
        fn serve_idle(&self, _: BorrowedFd<'_>, _: Duration) -> Result<(), FlowError> {
            Ok(())
        }
    }

    #[test]
    fn programs_run_on_tcp_as_they_are_and_on_shm_and_xdp_under_the_library() {
        assert_eq!(programs("tcp"), Programs::Kernel);
        assert_eq!(programs("shm"), Programs::Library);
        assert_eq!(programs("xdp"), Programs::LibraryWithRelay);
        for other in ["udp", "uring", "unix", "mptcp", "no-such"] {
            assert_eq!(programs(other), Programs::No, "{other}");
        }
        assert_eq!(program_transports(), "tcp, shm or xdp");
    }

    #[test]
    fn a_total_sums_flows_and_counts_each_shared_scopes_drops_once() {
        let d = |sent, dropped| DatagramStats {
            datagrams_sent: sent,
            retries: 1,
            dropped,
            ..DatagramStats::default()
        };
        let m = |s: DatagramStats, scope| Arc::new(Fixed(s, scope)) as Arc<dyn FlowMonitor>;
        assert_eq!(total_datagrams(&[]), None);
        let t = total_datagrams(&[
            // Two flows of one port, the later read seeing two drops more.
            m(d(10, 5), Some(3)),
            m(d(20, 7), Some(3)),
            // A flow of another port.
            m(d(30, 1), Some(4)),
            // Two flows with drops of their own.
            m(d(1, 2), None),
            m(d(2, 2), None),
        ])
        .unwrap();
        assert_eq!(t.datagrams_sent, 63);
        assert_eq!(t.retries, 5);
        assert_eq!(t.dropped, 7 + 1 + 2 + 2);
    }
}
