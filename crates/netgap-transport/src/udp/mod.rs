//! Kernel UDP over IPv4 or IPv6: the one transport that may lose, reorder or
//! duplicate what it carries, so every test runs over it through the same
//! [`Flow`] as the byte streams while the loss is counted instead of hidden.
//!
//! Each `send_all` is one datagram on a connected socket: a 24-byte header
//! (magic, kind, flags, a sequence number per direction and the payload's
//! offset in the sender's byte stream) and the message, so a message is at
//! most [`MAX_MESSAGE_BYTES`] (65,507 bytes of IPv4 UDP payload minus the
//! header; IPv6 is held to the same limit) and the plan refuses larger
//! sizes. The rendezvous: the agent binds a socket on the control
//! connection's address, the coordinator connects its socket to it and sends
//! a hello until a hello-ack comes back (or [`CONNECT_TIMEOUT`] passes); the
//! agent connects its socket to the hello's source. `--sndbuf`/`--rcvbuf`
//! apply; event mode blocks with socket timeouts, poll mode spins on a
//! non-blocking socket, as for the stream sockets.
//!
//! Receiving: the receiver delivers each datagram with a sequence number at
//! or after the one it expects. A jump counts the skipped datagrams as lost
//! and their bytes (from the offsets) as lost bytes, reported to the test
//! through [`Receiver::lost_bytes`], so a bulk receive waiting for N bytes
//! ends once received plus lost bytes reach N and `--verify` checks each
//! datagram against the pattern of its own offset. An older sequence number
//! is never delivered: a late arrival of one counted lost is `reordered`,
//! anything else a `duplicate`. Lost means "never delivered": a datagram
//! that was merely late stays lost (and is also counted reordered), so
//! received plus lost bytes equals sent bytes exactly, which the runner
//! checks.
//!
//! Retries: a receiver that has waited a retry timeout with nothing new
//! re-sends its own last data datagram flagged RETRY, with exponential
//! backoff; a peer receiving a RETRY datagram answers by re-sending its own
//! last one. That is stop-and-wait for request/response (a lost ping is
//! delivered by the re-send; a lost pong is answered by the re-sent ping,
//! which the peer sees as a duplicate and never delivers twice), and it
//! ends a bulk burst whose tail was lost: the receiver learns of the last
//! datagram from the re-send (or from the peer's answer to its own retry)
//! and counts the gap before it. The retry timeout ([`crate::rto`], the
//! flow engine's datagram flows follow the same rule) is 20 ms until
//! measured, then four times the smoothed wait of receive calls that
//! needed no retry, within 2 ms..1 s, and stays backed off after a wait
//! that needed one (Karn); it moves only when the new value differs by
//! more than a quarter. Event mode waits with SO_RCVTIMEO, which the
//! kernel rounds up to its tick (about 8 ms for short timeouts where this
//! was written). The inactivity timeout still ends a receive that makes no
//! progress, so a silent peer is [`FlowError::TimedOut`], never a hang.
//!
//! Tails: a test that ends a burst says so ([`Sender::end_burst`]) and the
//! flow sends a header-only probe naming its last datagram. Everything sent
//! before the probe is ahead of it in the peer's queue, so a peer that has
//! not got that datagram answers with a header-only NACK and the datagram
//! is re-sent at once. The full queue that dropped the tail often drops the
//! probe too, so while this end waits (in a receive or idle) it probes again
//! after [`PROBE_FIRST`], doubling up to the retry timeout: a lost tail
//! costs about the peer's time to drain its queue, not a retry timeout.
//! Probes and NACKs carry no payload and are not counted. Nothing is ever
//! declared lost on a timer: a loss is only counted once a later datagram
//! proves it.
//!
//! Limits: the last datagram is copied once per send so it can be re-sent
//! (one memcpy of the message, part of what this transport costs). A
//! repetition's last datagram can only be recovered if its sender answers
//! while its test is idle; the runner and the agent do that through
//! [`FlowMonitor::serve_idle`] while they wait on the control connection.
//! A retry timeout can fire while the peer is merely slow: the spurious
//! re-send is counted as a retry (and a duplicate at the peer) all the same.
//! Late datagrams are told from duplicates for the last [`MAX_LOST_RANGES`]
//! gaps; older late arrivals count as duplicates. On a real network a probe
//! or a re-send can overtake datagrams still in flight; those then count as
//! lost and, when they arrive, reordered, since they were not delivered in
//! order.
//!
//! Code: the datagram layout is [`wire`] and the retry protocol
//! [`reliable`], both plain code without sockets or a clock, tested
//! there; this module holds the sockets and the waits that drive them.
//!
//! Workload runs: a flow can leave from a chosen local address (bound
//! before the connect, [`Transport::connect_from`]), so multirail puts one
//! on each link; the multi-client flow engine carries udp too (its datagram
//! path, `flows::datagram`), speaking this header for thousands of
//! request/response flows per host.

use super::tcp::wait_readable;
use super::{
    Capabilities, DatagramStats, Flow, FlowConfig, FlowError, FlowMonitor, Listener, Receiver,
    Sender, Transport, TransportError,
};
use crate::buffer::{AlignedBuffer, BufferLayout};
#[cfg(test)]
use crate::rto::RETRY_MIN;
use crate::rto::{Hysteresis, RetryTimeout};
use netgap_core::spec::{Mode, TransportOptions};
use nix::sys::socket::MsgFlags;
use nix::sys::time::TimeSpec;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

const NAME: &str = "udp";

pub mod reliable;
mod shared;
pub mod wire;

use reliable::{
    AckPacer, Answer, ProbeTimer, Receiving, RecvWait, SendCheck, Sending, SilenceWatch, Tick,
};
pub use reliable::{MAX_LOST_RANGES, PROBE_FIRST};
pub(crate) use wire::{Header, Kind, FLAG_RETRY};
pub use wire::{HEADER_BYTES, MAX_MESSAGE_BYTES};

/// How long a coordinator keeps sending its hello without an answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Interval between hellos while connecting.
pub(crate) const HELLO_INTERVAL: Duration = Duration::from_millis(20);
/// Bytes after the caller's buffer that catch the rest of a datagram; more
/// than any UDP payload, so no datagram is ever truncated.
const OVERFLOW_BYTES: usize = 1 << 16;
/// Most datagrams a sending end reads from its peer in one look.
const LISTEN_BATCH: usize = 64;
/// Spins between deadline checks in poll mode (see stream_socket).
const SPINS_PER_CLOCK_READ: u32 = 64;

/// Kernel UDP datagrams.
pub(crate) struct Udp;

/// [`DatagramStats`] as atomics, shared by the halves of a flow.
#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    lost: AtomicU64,
    lost_bytes: AtomicU64,
    reordered: AtomicU64,
    duplicates: AtomicU64,
    retries: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> DatagramStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DatagramStats {
            datagrams_sent: get(&self.sent),
            datagrams_received: get(&self.received),
            lost: get(&self.lost),
            lost_bytes: get(&self.lost_bytes),
            reordered: get(&self.reordered),
            duplicates: get(&self.duplicates),
            retries: get(&self.retries),
            dropped: 0,
        }
    }
}

/// Datagrams the kernel dropped at `socket` since it opened (its receive
/// buffer full): `SO_MEMINFO`'s drop count; `None` when the kernel does not
/// say.
pub(crate) fn kernel_drops(socket: &UdpSocket) -> Option<u64> {
    // `SK_MEMINFO_DROPS` of linux/sock_diag.h: the ninth of the counters.
    const SK_MEMINFO_DROPS: usize = 8;
    let mut info = [0u32; 9];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is valid for writes of `len` bytes, and the kernel
    // writes at most `len` of them.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize > SK_MEMINFO_DROPS * 4).then(|| u64::from(info[SK_MEMINFO_DROPS]))
}

/// The sending direction's state.
struct TxState {
    /// The numbering of data datagrams.
    seq: Sending,
    /// The last data datagram sent, header and payload, in its first
    /// `last_bytes`, for re-sends; every datagram is sent from it, so it is
    /// a message buffer placed as the point asks.
    last: AlignedBuffer,
    /// Bytes of `last` in use; 0 before the first datagram.
    last_bytes: usize,
    /// Whether the peer still answers a sender that only sends.
    silence: SilenceWatch,
}

/// The receiving direction's state.
struct RxState {
    /// What arrived, what was lost and what comes next.
    recv: Receiving,
    /// Where each datagram's header lands.
    hdr: [u8; HEADER_BYTES],
    /// Where a datagram's payload lands past the caller's buffer.
    overflow: AlignedBuffer,
    /// Undelivered payload bytes in `overflow`.
    pending: std::ops::Range<usize>,
    /// The retry timeout, from the waits of receive calls that needed no
    /// retry.
    rto: RetryTimeout,
    /// SO_RCVTIMEO currently set (event mode).
    rcv_timeout: Option<Duration>,
    /// When this end tells the peer it is receiving ([`Kind::Ack`]).
    acks: AckPacer,
}

/// Everything the halves of a flow and its monitor share.
struct Shared {
    socket: UdpSocket,
    mode: Mode,
    io_timeout: Duration,
    tx: Mutex<TxState>,
    rx: Mutex<RxState>,
    counters: Counters,
    /// Datagrams of ours that arrived from the peer, of any kind: what a
    /// sender that hears nothing else watches to tell the peer is alive.
    heard: AtomicU64,
    /// Sequence number of the last datagram of the latest burst, probed for
    /// while this end waits (`u64::MAX`: none).
    probe_seq: AtomicU64,
    /// Set by the flow's [`super::AbortHandle`]: every send and receive
    /// fails from then on. Checked per datagram and per wait, because a
    /// peer that keeps sending keeps a receive loop busy, and a sender on
    /// a datagram socket is not stopped by its shutdown.
    aborted: AtomicBool,
    /// Test hook: the data datagram with this sequence number is not sent
    /// the first time (`u64::MAX`: none).
    #[cfg(test)]
    drop_seq: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// A data-path error; an ICMP "port unreachable" reported on the connected
/// socket means the peer's socket is gone.
fn flow_err(e: io::Error, timeout: Duration) -> FlowError {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        return FlowError::Closed;
    }
    FlowError::from_io(e, timeout)
}

fn protocol_err(detail: String) -> FlowError {
    FlowError::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("udp peer broke the protocol: {detail}"),
    ))
}

/// What became of one received datagram.
enum Arrival {
    /// New data with this many payload bytes, to deliver.
    Data(usize),
    /// Nothing to deliver: control, late, duplicate or not ours.
    Nothing,
}

impl FlowMonitor for Shared {
    fn datagram_stats(&self) -> DatagramStats {
        DatagramStats {
            dropped: kernel_drops(&self.socket).unwrap_or(0),
            ..self.counters.snapshot()
        }
    }

    fn serve_idle(&self, wake: BorrowedFd<'_>, max_wait: Duration) -> Result<(), FlowError> {
        self.idle(wake, max_wait)
    }
}

/// Sending half of a udp flow.
struct UdpSender(Arc<Shared>);
/// Receiving half of a udp flow.
struct UdpReceiver(Arc<Shared>);

/// A connected udp flow.
struct UdpFlow {
    tx: UdpSender,
    rx: UdpReceiver,
}

impl Sender for UdpSender {
    /// Sends all of `buf` as one datagram (nothing for an empty `buf`).
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        if !buf.is_empty() {
            self.0.send_data(buf)?;
        }
        Ok(buf.len())
    }

    fn send_all(&mut self, buf: &[u8]) -> Result<(), FlowError> {
        self.send_some(buf).map(|_| ())
    }

    /// Sends a header-only probe naming the burst's last datagram.
    fn end_burst(&mut self) -> Result<(), FlowError> {
        self.0.end_burst();
        Ok(())
    }
}

impl Receiver for UdpReceiver {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        self.0.recv(buf)
    }

    fn lost_bytes(&self) -> u64 {
        self.0.counters.lost_bytes.load(Ordering::Relaxed)
    }
}

impl Flow for UdpFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }

    fn monitor(&self) -> Option<Arc<dyn FlowMonitor>> {
        Some(self.tx.0.clone())
    }

    fn abort_handle(&self) -> Option<super::AbortHandle> {
        Some(super::AbortHandle::weak(
            Arc::downgrade(&self.tx.0),
            Shared::abort,
        ))
    }
}

fn opt_err(option: &'static str) -> impl FnOnce(io::Error) -> TransportError {
    move |source| TransportError::Option {
        transport: NAME,
        option,
        source,
    }
}

/// A UDP socket for `addr`'s family with the buffer sizes applied;
/// `fail` names the step for errors of the socket itself.
pub(crate) fn new_socket(
    addr: SocketAddr,
    options: &TransportOptions,
    fail: impl FnOnce(io::Error) -> TransportError,
) -> Result<Socket, TransportError> {
    let socket =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(fail)?;
    let sock = SockRef::from(&socket);
    if let Some(b) = options.sndbuf_bytes {
        sock.set_send_buffer_size(b as usize)
            .map_err(opt_err("SO_SNDBUF"))?;
    }
    if let Some(b) = options.rcvbuf_bytes {
        sock.set_recv_buffer_size(b as usize)
            .map_err(opt_err("SO_RCVBUF"))?;
    }
    Ok(socket)
}

fn into_flow(socket: UdpSocket, config: &FlowConfig) -> Result<UdpFlow, TransportError> {
    let shared = Arc::new(
        Shared::new(socket, config).map_err(opt_err("O_NONBLOCK/SO_SNDTIMEO, message buffers"))?,
    );
    Ok(UdpFlow {
        tx: UdpSender(Arc::clone(&shared)),
        rx: UdpReceiver(shared),
    })
}

/// Opens the agent's socket on `local_ip`, ephemeral port.
fn listen_socket(config: &FlowConfig, local_ip: IpAddr) -> Result<UdpDataListener, TransportError> {
    let listen_err = |source| TransportError::Listen {
        transport: NAME,
        source,
    };
    let addr = SocketAddr::new(local_ip, 0);
    let socket = new_socket(addr, &config.options, listen_err)?;
    socket.bind(&addr.into()).map_err(listen_err)?;
    Ok(UdpDataListener {
        socket: socket.into(),
        config: config.clone(),
    })
}

/// Connects to the agent's socket at `addr` (`IP:PORT`), from `local_ip`
/// when given (port chosen by the system), and knocks with hellos until it
/// answers.
fn connect_flow(
    config: &FlowConfig,
    addr: &str,
    local_ip: Option<IpAddr>,
) -> Result<UdpFlow, TransportError> {
    let sa: SocketAddr = addr.parse().map_err(|e| TransportError::BadAddress {
        transport: NAME,
        addr: addr.to_string(),
        detail: format!("{e}"),
    })?;
    let connect_err = |source| TransportError::Connect {
        transport: NAME,
        addr: addr.to_string(),
        source,
    };
    let socket = new_socket(sa, &config.options, connect_err)?;
    if let Some(ip) = local_ip {
        // Bound before the connect, so the flow leaves from this address
        // (and so over its link) whatever the routing table prefers.
        socket
            .bind(&SocketAddr::new(ip, 0).into())
            .map_err(connect_err)?;
    }
    socket.connect(&SockAddr::from(sa)).map_err(connect_err)?;
    let socket: UdpSocket = socket.into();
    socket
        .set_read_timeout(Some(HELLO_INTERVAL))
        .map_err(connect_err)?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let hello = Header::control(Kind::Hello).encode();
    let mut buf = [0u8; HEADER_BYTES];
    'knock: loop {
        if Instant::now() >= deadline {
            return Err(connect_err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer to {} ms of hellos", CONNECT_TIMEOUT.as_millis()),
            )));
        }
        socket.send(&hello).map_err(connect_err)?;
        let knocked = Instant::now();
        while knocked.elapsed() < HELLO_INTERVAL {
            match socket.recv(&mut buf) {
                Ok(n) => {
                    if Header::decode(&buf[..n]).is_ok_and(|h| h.kind == Kind::HelloAck) {
                        break 'knock;
                    }
                }
                Err(e) if is_transient(&e) || e.kind() == io::ErrorKind::TimedOut => {
                    continue 'knock
                }
                Err(e) => return Err(connect_err(e)),
            }
        }
    }
    into_flow(socket, config)
}

struct UdpDataListener {
    socket: UdpSocket,
    config: FlowConfig,
}

impl Listener for UdpDataListener {
    fn addr(&self) -> String {
        self.socket
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
        Ok(Box::new(self.accept_flow(timeout)?))
    }
}

impl UdpDataListener {
    /// Waits for a hello, connects to its sender and answers it.
    fn accept_flow(&mut self, timeout: Duration) -> Result<UdpFlow, TransportError> {
        let listen_err = |source| TransportError::Listen {
            transport: NAME,
            source,
        };
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; HEADER_BYTES];
        let peer = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            wait_readable(&self.socket, left).map_err(|e| match e {
                None => TransportError::AcceptTimeout {
                    transport: NAME,
                    timeout_ms: timeout.as_millis(),
                },
                Some(source) => listen_err(source),
            })?;
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if Header::decode(&buf[..n]).is_ok_and(|h| h.kind == Kind::Hello) {
                        break from;
                    }
                }
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(listen_err(e)),
            }
        };
        let socket = self.socket.try_clone().map_err(listen_err)?;
        socket.connect(peer).map_err(listen_err)?;
        socket
            .send(&Header::control(Kind::HelloAck).encode())
            .map_err(listen_err)?;
        into_flow(socket, &self.config)
    }
}

impl Transport for Udp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "kernel UDP, one datagram per message: loss, reordering and retries counted"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: false,
            message_boundaries: true,
            cross_host: true,
            modes: &Mode::ALL,
            options: crate::options::SOCKET_BUFFERS,
            runs_on_loopback: true,
            ip_port_addresses: true,
            binds_local: true,
            programs: crate::Programs::No,
            framing: Some(crate::Framing::Udp),
        }
    }

    fn max_message_bytes(&self) -> Option<u64> {
        Some(MAX_MESSAGE_BYTES as u64)
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        Ok(Box::new(listen_socket(config, local_ip)?))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        Ok(Box::new(connect_flow(config, addr, None)?))
    }

    fn connect_from(
        &self,
        config: &FlowConfig,
        addr: &str,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Flow>, TransportError> {
        Ok(Box::new(connect_flow(config, addr, Some(local_ip))?))
    }

    fn engine_path(&self) -> Option<&'static dyn crate::flows::DataPath> {
        Some(&crate::flows::DATAGRAMS)
    }
}

/// Sends `header` and `payload` as one datagram; for tests that play a
/// peer by hand.
#[cfg(test)]
fn send_raw(socket: &UdpSocket, header: &Header, payload: &[u8]) {
    use std::io::IoSlice;
    let header = header.encode();
    let iov = [IoSlice::new(&header), IoSlice::new(payload)];
    nix::sys::uio::writev(socket, &iov).expect("raw send");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::os::unix::net::UnixStream;

    fn config(mode: Mode, io_timeout: Duration) -> FlowConfig {
        FlowConfig {
            mode,
            options: TransportOptions::default(),
            io_timeout,
        }
    }

    /// A socket whose small receive buffer is never read turns datagrams
    /// away, and says how many.
    #[test]
    fn the_kernels_drops_at_a_full_socket_are_counted() {
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        socket2::SockRef::from(&rx)
            .set_recv_buffer_size(4096)
            .expect("rcvbuf");
        assert_eq!(kernel_drops(&rx), Some(0));
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let to = rx.local_addr().expect("addr");
        for _ in 0..200 {
            tx.send_to(&[7u8; 1024], to).expect("send");
        }
        let dropped = kernel_drops(&rx).expect("the kernel says");
        assert!(dropped > 100, "{dropped} of 200 turned away");
    }

    /// A connected pair: (coordinator end, agent end).
    fn pair(mode: Mode, io_timeout: Duration) -> (UdpFlow, UdpFlow) {
        let cfg = config(mode, io_timeout);
        let mut listener = listen_socket(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("listen");
        let addr = listener.addr();
        let agent = std::thread::spawn(move || listener.accept_flow(Duration::from_secs(3)));
        let client = connect_flow(&cfg, &addr, None).expect("connect");
        let server = agent.join().expect("join").expect("accept");
        (client, server)
    }

    /// An agent end whose peer is a raw socket the test drives by hand.
    fn flow_with_raw_peer(io_timeout: Duration) -> (UdpFlow, UdpSocket) {
        let cfg = config(Mode::Event, io_timeout);
        let mut listener = listen_socket(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("listen");
        let raw = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        raw.connect(listener.addr()).expect("connect");
        raw.send(&Header::control(Kind::Hello).encode())
            .expect("hello");
        let flow = listener
            .accept_flow(Duration::from_secs(3))
            .expect("accept");
        let mut ack = [0u8; 64];
        let n = raw.recv(&mut ack).expect("hello-ack");
        assert_eq!(
            Header::decode(&ack[..n]).ok().map(|h| h.kind),
            Some(Kind::HelloAck)
        );
        (flow, raw)
    }

    fn data(seq: u64, offset_bytes: u64) -> Header {
        Header {
            kind: Kind::Data,
            flags: 0,
            seq,
            offset_bytes,
        }
    }

    fn stats(flow: &UdpFlow) -> DatagramStats {
        flow.tx.0.counters.snapshot()
    }

    /// The next send of datagram `seq` from `flow` is lost on the way.
    fn drop_seq(flow: &UdpFlow, seq: u64) {
        flow.tx.0.drop_seq.store(seq, Ordering::Relaxed);
    }

    #[test]
    fn round_trips_one_byte_one_kib_and_the_largest_datagram() {
        for mode in Mode::ALL {
            let (mut c, mut s) = pair(mode, Duration::from_secs(3));
            for size in [1, 1024, MAX_MESSAGE_BYTES] {
                let msg: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
                c.send_all(&msg).expect("send");
                let mut got = vec![0u8; size];
                s.recv_exact(&mut got).expect("recv");
                assert_eq!(got, msg, "{mode} {size}");
                s.send_all(&got).expect("echo");
                let mut back = vec![0u8; size];
                c.recv_exact(&mut back).expect("echo back");
                assert_eq!(back, msg);
            }
            // Spurious retries on a loaded machine may add re-sends, never
            // a loss.
            let cs = stats(&c);
            assert_eq!(cs.datagrams_sent - cs.retries, 3);
            assert_eq!(cs.datagrams_received - cs.duplicates, 3);
            assert_eq!(cs.lost, 0);
        }
    }

    #[test]
    fn a_datagram_is_delivered_in_pieces_to_small_buffers() {
        let (mut c, mut s) = pair(Mode::Event, Duration::from_secs(3));
        c.send_all(&[1, 2, 3, 4, 5]).expect("send");
        let (_, rx) = s.split();
        let mut two = [0u8; 2];
        assert_eq!(rx.recv_some(&mut two).expect("recv"), 2);
        assert_eq!(two, [1, 2]);
        assert_eq!(rx.recv_some(&mut two).expect("recv"), 2);
        assert_eq!(two, [3, 4]);
        assert_eq!(rx.recv_some(&mut two).expect("recv"), 1);
        assert_eq!(two[0], 5);
    }

    #[test]
    fn an_oversize_message_is_refused() {
        let (mut c, _s) = pair(Mode::Event, Duration::from_secs(3));
        let e = c.send_all(&vec![0u8; MAX_MESSAGE_BYTES + 1]).unwrap_err();
        assert!(
            matches!(e, FlowError::TooLarge { size_bytes, max_bytes }
                if size_bytes == MAX_MESSAGE_BYTES as u64 + 1 && max_bytes == MAX_MESSAGE_BYTES as u64),
            "{e}"
        );
        assert_eq!(stats(&c).datagrams_sent, 0);
    }

    #[test]
    fn a_lost_reply_is_retried_and_counted() {
        for mode in Mode::ALL {
            let (mut c, mut s) = pair(mode, Duration::from_secs(3));
            // The agent's first reply never leaves; the ping is re-sent after
            // the retry timeout and the agent answers with the reply again.
            drop_seq(&s, 0);
            let echo = std::thread::spawn(move || {
                let mut b = [0u8; 4];
                for _ in 0..2 {
                    s.recv_exact(&mut b)?;
                    s.send_all(&b)?;
                }
                Ok::<_, FlowError>(s)
            });
            let t0 = Instant::now();
            let mut b = [0u8; 4];
            c.send_all(b"ping").expect("send");
            c.recv_exact(&mut b).expect("reply after a retry");
            assert_eq!(&b, b"ping");
            assert!(
                t0.elapsed() >= RETRY_MIN,
                "{mode}: answered before any retry"
            );
            c.send_all(b"pong").expect("send");
            c.recv_exact(&mut b).expect("second reply");
            assert_eq!(&b, b"pong");
            let s = echo.join().expect("join").expect("echo");
            // Whichever end's retry timeout fires first, a re-send of the
            // reply and one of the ping (a retry or an answer) end the wait
            // and the agent sees the ping twice; a loaded machine may add
            // spurious retries, never a loss or a second delivery.
            let (cs, ss) = (stats(&c), stats(&s));
            assert!(cs.retries >= 1, "{mode}: {cs:?}");
            assert!(ss.retries >= 1, "{mode}: the reply was re-sent: {ss:?}");
            assert!(ss.duplicates >= 1, "{mode}: {ss:?}");
            assert_eq!((cs.lost, ss.lost), (0, 0));
        }
    }

    #[test]
    fn a_lost_last_reply_is_answered_while_the_agent_is_idle() {
        let (mut c, mut s) = pair(Mode::Event, Duration::from_secs(3));
        drop_seq(&s, 0);
        let (wake, waker) = UnixStream::pair().expect("pair");
        let monitor = s.monitor().expect("monitor");
        let agent = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            s.recv_exact(&mut b)?;
            s.send_all(&b)?;
            // The repetition is over for the agent; it waits on "control".
            monitor.serve_idle(wake.as_fd(), Duration::from_secs(3))?;
            Ok::<_, FlowError>(monitor)
        });
        c.send_all(&[9]).expect("send");
        let mut b = [0u8; 1];
        c.recv_exact(&mut b)
            .expect("reply re-sent by the idle agent");
        assert_eq!(b, [9]);
        use std::io::Write;
        (&waker).write_all(b"x").expect("wake");
        let monitor = agent.join().expect("join").expect("agent");
        assert!(monitor.datagram_stats().retries >= 1);
        assert!(stats(&c).retries >= 1);
    }

    #[test]
    fn idle_service_leaves_new_data_for_the_test() {
        let (mut c, mut s) = pair(Mode::Event, Duration::from_secs(3));
        let (wake, _waker) = UnixStream::pair().expect("pair");
        c.send_all(b"next").expect("send");
        let t0 = Instant::now();
        s.monitor()
            .expect("monitor")
            .serve_idle(wake.as_fd(), Duration::from_millis(50))
            .expect("idle");
        assert!(t0.elapsed() >= Duration::from_millis(50));
        let mut b = [0u8; 4];
        s.recv_exact(&mut b).expect("still there");
        assert_eq!(&b, b"next");
    }

    #[test]
    fn a_gap_counts_lost_datagrams_and_a_late_one_counts_reordered() {
        let (mut flow, raw) = flow_with_raw_peer(Duration::from_secs(3));
        send_raw(&raw, &data(0, 0), b"aa");
        send_raw(&raw, &data(3, 7), b"dd"); // 1 (2 bytes) and 2 (3 bytes) lost
        send_raw(&raw, &data(2, 4), b"ccc"); // late
        send_raw(&raw, &data(3, 7), b"dd"); // duplicate
        send_raw(&raw, &data(4, 9), b"e");
        let (_, rx) = flow.split();
        let mut b = [0u8; 16];
        let n = rx.recv_some(&mut b).expect("0");
        assert_eq!(&b[..n], b"aa");
        assert_eq!(rx.lost_bytes(), 0);
        let n = rx.recv_some(&mut b).expect("3");
        assert_eq!(&b[..n], b"dd");
        assert_eq!(rx.lost_bytes(), 5);
        let n = rx.recv_some(&mut b).expect("4");
        assert_eq!(
            &b[..n],
            b"e",
            "late and duplicate datagrams are not delivered"
        );
        let st = stats(&flow);
        assert_eq!(st.datagrams_received, 5);
        assert_eq!((st.lost, st.lost_bytes), (2, 5));
        assert_eq!((st.reordered, st.duplicates), (1, 1));
    }

    #[test]
    fn a_bulk_receive_ends_when_received_plus_lost_bytes_are_all_sent() {
        for mode in Mode::ALL {
            let (mut c, mut s) = pair(mode, Duration::from_secs(3));
            // The 4th datagram and the last one are lost; the sender then
            // waits for an ack, and its retry re-sends the last datagram.
            drop_seq(&c, 3);
            let server = std::thread::spawn(move || {
                let mut scratch = vec![0u8; 256 * 1024];
                s.split().1.recv_discard(10 * 1000, &mut scratch)?;
                let lost = s.split().1.lost_bytes();
                s.send_all(&[1])?;
                Ok::<_, FlowError>((s, lost))
            });
            let msg = vec![5u8; 1000];
            for i in 0..10 {
                if i == 9 {
                    drop_seq(&c, 9);
                }
                c.send_all(&msg).expect("send");
            }
            c.split().0.end_burst().expect("probe");
            let mut ack = [0u8; 1];
            c.recv_exact(&mut ack).expect("ack");
            let (s, lost) = server.join().expect("join").expect("server");
            assert_eq!(lost, 1000, "{mode}");
            let (cs, ss) = (stats(&c), stats(&s));
            assert!(cs.retries >= 1, "{mode}: the tail was re-sent: {cs:?}");
            assert_eq!((ss.lost, ss.lost_bytes), (1, 1000), "{mode}: {ss:?}");
        }
    }

    #[test]
    fn a_burst_ends_with_a_probe_and_a_nack_brings_the_tail_back() {
        let (mut flow, raw) = flow_with_raw_peer(Duration::from_secs(3));
        flow.send_all(b"one").expect("send");
        flow.send_all(b"two").expect("send");
        flow.split().0.end_burst().expect("probe");
        let waiter = std::thread::spawn(move || {
            let mut b = [0u8; 8];
            let n = flow.recv_exact(&mut b[..5]).map(|()| 5);
            (flow, n, b)
        });
        let mut got = [0u8; 64];
        let mut next = || {
            let n = raw.recv(&mut got).expect("datagram");
            (
                Header::decode(&got[..n]).expect("ours"),
                got[HEADER_BYTES..n].to_vec(),
            )
        };
        assert_eq!(next().1, b"one");
        assert_eq!(next().1, b"two");
        let (probe, _) = next();
        assert_eq!(
            (probe.kind, probe.seq, probe.offset_bytes),
            (Kind::Probe, 1, 6),
            "the probe names the last datagram and where it ended"
        );
        // "Two" was lost on the way: ask for it.
        let nack = Header {
            kind: Kind::Nack,
            flags: 0,
            seq: 1,
            offset_bytes: 3,
        };
        raw.send(&nack.encode()).expect("nack");
        // The waiting end sends its probe again on its own timer, which a
        // busy machine may fire before the nack is read: look past those.
        let (again, payload) = loop {
            let (h, p) = next();
            if h.kind != Kind::Probe {
                break (h, p);
            }
        };
        assert_eq!(
            (again.kind, again.seq, payload.as_slice()),
            (Kind::Data, 1, &b"two"[..])
        );
        send_raw(&raw, &data(0, 0), b"reply");
        let (flow, n, b) = waiter.join().expect("join");
        assert_eq!(n.expect("reply"), 5);
        assert_eq!(&b[..5], b"reply");
        assert!(stats(&flow).retries >= 1);
    }

    #[test]
    fn a_one_way_sender_names_a_peer_that_stops_receiving_and_not_one_that_receives() {
        for mode in Mode::ALL {
            let (mut c, mut s) = pair(mode, Duration::from_millis(200));
            // A receiving peer acknowledges: sending goes on for several
            // timeouts though the sender never receives.
            let stop = Arc::new(AtomicBool::new(false));
            let stop_rx = Arc::clone(&stop);
            let receiver = std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while !stop_rx.load(Ordering::Relaxed) {
                    match s.split().1.recv_some(&mut buf) {
                        Ok(_) | Err(FlowError::TimedOut { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                s
            });
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(800) {
                c.send_all(&[7u8; 1000]).expect("a receiving peer is alive");
                std::thread::sleep(Duration::from_micros(200));
            }
            stop.store(true, Ordering::Relaxed);
            let s = receiver.join().expect("receiver");
            // The peer stops receiving (as a stopped process would):
            // the sender fails within the timeout and a fraction of it.
            let t0 = Instant::now();
            let e = loop {
                if let Err(e) = c.send_all(&[7u8; 1000]) {
                    break e;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(2),
                    "{mode}: never noticed"
                );
                std::thread::sleep(Duration::from_micros(200));
            };
            let waited = t0.elapsed();
            assert!(matches!(e, FlowError::TimedOut { timeout_ms: 200 }), "{e}");
            assert!(
                waited >= Duration::from_millis(150) && waited < Duration::from_millis(400),
                "{mode}: {waited:?}"
            );
            drop(s);
        }
    }

    #[test]
    fn a_silent_peer_times_out_within_the_timeout() {
        for mode in Mode::ALL {
            let (mut c, _s) = pair(mode, Duration::from_millis(200));
            c.send_all(&[1]).expect("send");
            let t0 = Instant::now();
            let e = c.recv_exact(&mut [0u8; 1]).unwrap_err();
            let waited = t0.elapsed();
            assert!(matches!(e, FlowError::TimedOut { timeout_ms: 200 }), "{e}");
            assert!(
                waited >= Duration::from_millis(200) && waited < Duration::from_millis(600),
                "{mode}: {waited:?}"
            );
            assert!(stats(&c).retries >= 1, "it asked before giving up");
        }
    }

    #[test]
    fn garbage_and_bad_offsets_never_panic() {
        let (mut flow, raw) = flow_with_raw_peer(Duration::from_secs(3));
        raw.send(&[]).expect("empty");
        raw.send(b"NG").expect("short");
        raw.send(&[0xff; 100]).expect("junk");
        send_raw(&raw, &data(0, 0), b"ok");
        let mut b = [0u8; 8];
        let n = flow.split().1.recv_some(&mut b).expect("the valid one");
        assert_eq!(&b[..n], b"ok");
        // Offsets going backwards are a broken peer: an error, not a panic.
        send_raw(&raw, &data(1, 0), b"x");
        assert!(flow.split().1.recv_some(&mut b).is_err());
        send_raw(&raw, &data(5, u64::MAX), b"xy");
        assert!(flow.split().1.recv_some(&mut b).is_err());
    }

    #[test]
    fn a_flow_connected_from_a_local_address_leaves_from_it() {
        let cfg = config(Mode::Event, Duration::from_secs(3));
        let mut listener = listen_socket(&cfg, IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("listen");
        let addr = listener.addr();
        let agent = std::thread::spawn(move || listener.accept_flow(Duration::from_secs(3)));
        let local = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
        assert!(Udp.capabilities().binds_local);
        let mut c = Udp.connect_from(&cfg, &addr, local).expect("connect");
        let s = agent.join().expect("join").expect("accept");
        let peer = s.tx.0.socket.peer_addr().expect("connected");
        assert_eq!(peer.ip(), local);
        c.send_all(b"rail").expect("send");
    }

    #[test]
    fn an_abort_ends_a_waiting_receive_and_a_receive_fed_without_pause() {
        for mode in Mode::ALL {
            // A receive that waits on a silent peer wakes at the abort.
            let (_c, mut s) = pair(mode, Duration::from_secs(20));
            let abort = s.abort_handle().expect("a udp flow can be aborted");
            let waiting = std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut buf = [0u8; 16];
                let got = s.recv_exact(&mut buf);
                (got, s.send_all(b"x"), t0.elapsed())
            });
            std::thread::sleep(Duration::from_millis(100));
            abort.abort();
            let (got, later, took) = waiting.join().expect("join");
            assert!(got.is_err() && later.is_err(), "{mode:?}");
            assert!(took < Duration::from_secs(2), "{mode:?}: {took:?}");
            // A receive loop the peer keeps busy stops at the abort too.
            let (mut c, mut s) = pair(mode, Duration::from_secs(20));
            let abort = s.abort_handle().expect("a udp flow can be aborted");
            let stop = Arc::new(AtomicBool::new(false));
            let feeding = std::thread::spawn({
                let stop = Arc::clone(&stop);
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = c.send_all(&[7u8; 1024]);
                    }
                }
            });
            let receiving = std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let t0 = Instant::now();
                let err = loop {
                    if let Err(e) = s.split().1.recv_some(&mut buf) {
                        break e;
                    }
                };
                (err, t0.elapsed())
            });
            std::thread::sleep(Duration::from_millis(200));
            abort.abort();
            let (_err, took) = receiving.join().expect("join");
            stop.store(true, Ordering::Relaxed);
            feeding.join().expect("join");
            assert!(took < Duration::from_secs(2), "{mode:?}: {took:?}");
        }
    }

    #[test]
    fn ipv6_works_where_there_is_ipv6() {
        let cfg = config(Mode::Event, Duration::from_secs(3));
        let Ok(mut listener) = Udp.listen(&cfg, IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)) else {
            eprintln!("no IPv6 loopback here");
            return;
        };
        let addr = listener.addr();
        let agent = std::thread::spawn(move || listener.accept(Duration::from_secs(3)));
        let mut c = Udp.connect(&cfg, &addr).expect("connect");
        let mut s = agent.join().expect("join").expect("accept");
        c.send_all(b"v6").expect("send");
        let mut b = [0u8; 2];
        s.recv_exact(&mut b).expect("recv");
        assert_eq!(&b, b"v6");
    }
}
