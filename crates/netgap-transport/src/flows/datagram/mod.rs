//! The flow engine over datagrams: the `udp` data path. A flow is one
//! client UDP socket, connected to the server's port, doing stop-and-wait
//! request/response in netgap's udp format (see [`crate::udp`]): each
//! request is one datagram with a sequence number, and the server answers
//! each datagram to its sender with the same bytes.
//!
//! - **Opening** a flow sends a hello until the server acks it (within the
//!   I/O timeout), so an unreachable server fails before the barrier, as a
//!   refused TCP connection does. With the point's token (every run between
//!   agents) the opening proves the session
//!   ([`netgap_proto::dataproof::DatagramConnectorProof`]): the hello
//!   carries the client's nonce, padded so the ack that answers it is no
//!   bigger; the ack carries the server's nonce and tag, which the client
//!   checks before it sends anything else; the client then sends a
//!   confirmation until the server acks it (one more round trip, before
//!   the barrier). The server derives its nonce from a secret of its own,
//!   the client's address and nonce, so it keeps nothing for a hello; it
//!   registers the flow with the worker the kernel steers it to only once
//!   the confirmation verifies, and drops, unanswered and counted as
//!   strangers, data from any address that has not. An address that is no
//!   netgap end of this point gets hellos and never a payload byte. Without
//!   a token (an engine inside one process) the hello registers the flow.
//! - **Loss** never hangs a flow: a request whose reply has not come within
//!   the worker's retry timeout is sent again (flagged RETRY), backing off
//!   up to [`RETRY_MAX`]; a reply older than the current request is a
//!   duplicate and is not delivered. The server remembers each flow's next
//!   sequence number, so it answers a repeated request again (a re-send)
//!   but counts its bytes once. A flow with no reply for the whole I/O
//!   timeout fails the run, as a stalled TCP flow does.
//! - **Bytes** count once per request, however many times its datagram
//!   went out: a client's `bytes_tx` when the request is issued and
//!   `bytes_rx` when its reply is accepted, the server's `bytes_rx` and
//!   `bytes_tx` when a request is new. Every exchange finishes before the
//!   run ends, so client and server bytes balance exactly even with loss;
//!   the loss shows in the [`DatagramStats`] of both ends (a lost request
//!   is a client retry the server never saw twice, a lost reply a server
//!   duplicate).
//! - **Memory**: a client flow holds no buffer: it sends from its worker's
//!   send buffer (header and message) and reads into its receive buffer
//!   (header, message and one byte, which catches an oversized datagram);
//!   the server holds 8 bytes of state per proven flow in a map capped at
//!   [`MAX_PEERS_PER_WORKER`] and one datagram buffer per worker, and
//!   nothing per unproven sender.
//!
//! The retry timeout is the udp transport's rule ([`crate::rto`]), kept
//! per worker (its flows share the server and the path): 20 ms until
//! measured, then four times the smoothed round trip of exchanges that
//! needed no re-send, within [`RETRY_MIN`]..[`RETRY_MAX`], and at least
//! the backed-off wait of the last exchange that needed one (Karn) until a
//! clean one.

use super::buffers::{BufferGauge, CountedBuffer, WorkerBuffers};
use super::machine::{MachineError, Moved, Progress};
use super::{EngineError, ServerTotals};
use crate::buffer::{BufferLayout, LayoutError};
#[cfg(doc)]
use crate::rto::{RETRY_MAX, RETRY_MIN};
use crate::udp::{Header, Kind, FLAG_RETRY, HEADER_BYTES, HELLO_INTERVAL, MAX_MESSAGE_BYTES};
use crate::TransportError;
use netgap_core::datagram::DatagramStats;
use netgap_core::spec::{Mode, TransportOptions};
use netgap_proto::dataproof::{
    DataProofError, DataToken, DatagramConnectorProof, DatagramListenerProof,
    DATAGRAM_ANSWER_BYTES, DATAGRAM_CONFIRM_BYTES, DATAGRAM_HELLO_BYTES, DATAGRAM_SECRET_BYTES,
    NONCE_BYTES,
};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod client;
mod server;

/// Flows one server worker keeps state for; datagrams from further peers
/// are counted as errors and not answered, so no sender can grow the
/// server's memory past about 64 bytes times this.
pub(super) const MAX_PEERS_PER_WORKER: usize = 65_536;
/// Datagrams a worker handles per wake-up before it looks at its stop flag
/// (server) or its other flows (client), so one busy socket cannot starve
/// the rest.
const BATCH: usize = 64;
/// How long a server worker sleeps in epoll before looking at the stop
/// flag, ms.
const STOP_POLL_MS: u16 = 50;

/// Refuses a message size one datagram cannot carry.
pub(super) fn check_size(size_bytes: usize) -> Result<(), EngineError> {
    if size_bytes > MAX_MESSAGE_BYTES {
        return Err(EngineError::Invalid(format!(
            "a {size_bytes}-byte message is larger than the {MAX_MESSAGE_BYTES} bytes one udp datagram carries"
        )));
    }
    Ok(())
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
        || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// The client side of one datagram pingpong flow: send request `seq`,
/// wait for its echo, repeat on [`DatagramClient::start`]; re-send on
/// [`DatagramClient::resend`] while waiting. Requests go out of its
/// worker's send buffer (`HEADER_BYTES + size` bytes, the header written
/// before each send) and replies land in its receive buffer (one byte
/// more, so a datagram that fills it is too long).
#[derive(Debug)]
pub(crate) struct DatagramClient {
    /// The message size; at least 1.
    size: usize,
    /// Requests issued so far; the current one is `issued - 1`.
    issued: u64,
    /// Whether the current request waits for its reply.
    waiting: bool,
    /// Whether the current request was sent more than once: its round trip
    /// is then no sample of the path (Karn).
    retried: bool,
    pub moved: Moved,
    pub stats: DatagramStats,
}

/// The next retry deadline of a worker's datagram flows: a min-heap holding
/// at most one entry per flow (its `armed` flag), so a flow finishing and
/// starting exchanges costs no heap operation; an entry that comes due for
/// a flow whose deadline has moved on is pushed again at the new one.
#[derive(Debug, Default)]
pub(crate) struct RetryQueue {
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
}

/// A UDP socket for `addr`'s family with the udp transport's options
/// (buffer sizes) applied.
fn udp_socket(addr: SocketAddr, options: &TransportOptions) -> io::Result<socket2::Socket> {
    crate::udp::new_socket(addr, options, |source| TransportError::Listen {
        transport: "udp",
        source,
    })
    .map_err(|e| match e {
        TransportError::Listen { source, .. } => source,
        other => io::Error::other(other),
    })
}

/// `kind`'s header followed by `payload`, as one datagram.
fn framed<const N: usize>(kind: Kind, payload: &[u8; N]) -> Vec<u8> {
    let mut d = Header::control(kind).encode().to_vec();
    d.extend_from_slice(payload);
    d
}

/// Sends `datagram` on the connected `socket` every [`HELLO_INTERVAL`]
/// until `take` accepts a reply (its header and payload) or `deadline`
/// passes (`None`). Replies it does not take are ignored: a stray, late or
/// forged datagram never ends the wait early.
fn knock<T>(
    socket: &UdpSocket,
    datagram: &[u8],
    deadline: Instant,
    mut take: impl FnMut(&Header, &[u8]) -> Option<T>,
) -> io::Result<Option<T>> {
    // One byte more than the largest reply taken, so a longer one is seen
    // as such.
    let mut buf = [0u8; HEADER_BYTES + DATAGRAM_ANSWER_BYTES + 1];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        socket.send(datagram)?;
        let knocked = now;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = HELLO_INTERVAL.saturating_sub(knocked.elapsed()).min(left);
            if wait.is_zero() {
                break;
            }
            socket.set_read_timeout(Some(wait))?;
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let Ok(h) = Header::decode(&buf[..n]) else {
                        continue;
                    };
                    if let Some(t) = take(&h, &buf[HEADER_BYTES..n]) {
                        return Ok(Some(t));
                    }
                }
                Err(e) if is_transient(&e) || e.kind() == ErrorKind::TimedOut => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Opens one client flow to `target`: a UDP socket (bound to `bind_ip`
/// when given) connected to it, which has sent a hello and had it acked
/// within `timeout`; with a `token`, the far end has also proven the
/// session and taken this flow's confirmation (see the module docs), and
/// nothing but hellos went to it before it proved it. The socket is left
/// non-blocking.
pub(super) fn open_flow(
    target: SocketAddr,
    bind_ip: Option<IpAddr>,
    options: &TransportOptions,
    timeout: Duration,
    token: Option<&DataToken>,
) -> io::Result<UdpSocket> {
    let socket = udp_socket(target, options)?;
    if let Some(ip) = bind_ip {
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    socket.connect(&target.into())?;
    let socket: UdpSocket = socket.into();
    let deadline = Instant::now() + timeout;
    let ms = timeout.as_millis();
    match token {
        None => {
            let hello = Header::control(Kind::Hello).encode();
            knock(&socket, &hello, deadline, |h, _| {
                (h.kind == Kind::HelloAck).then_some(())
            })?
            .ok_or_else(|| {
                io::Error::new(
                    ErrorKind::TimedOut,
                    format!("no answer to {ms} ms of udp hellos"),
                )
            })?;
        }
        Some(token) => {
            let mut nonce = [0u8; NONCE_BYTES];
            crate::random::fill_random(&mut nonce)?;
            let proof = DatagramConnectorProof::new(token.clone(), nonce);
            let hello = framed(Kind::Hello, &proof.hello());
            // An answer that fails the proof is remembered, not fatal: a
            // forged one must not end the opening of a flow whose server
            // is there.
            let mut refused = None;
            let confirm = knock(&socket, &hello, deadline, |h, payload| {
                if h.kind != Kind::HelloAck {
                    return None;
                }
                proof.on_answer(payload).map_err(|e| refused = Some(e)).ok()
            })?;
            let Some(confirm) = confirm else {
                let why = match refused {
                    Some(DataProofError::NotNetgap) => {
                        "it answered, but not as a netgap end".to_string()
                    }
                    Some(DataProofError::WrongSession) => {
                        "it answered with the proof of another session".to_string()
                    }
                    None => format!("no answer to {ms} ms of udp hellos"),
                };
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "the far end did not prove it belongs to this session ({why}); no payload was sent"
                    ),
                ));
            };
            let confirm: [u8; DATAGRAM_CONFIRM_BYTES] = confirm;
            knock(
                &socket,
                &framed(Kind::Confirm, &confirm),
                deadline,
                |h, _| (h.kind == Kind::ConfirmAck).then_some(()),
            )?
            .ok_or_else(|| {
                io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "the far end proved the session but did not take this flow's confirmation \
                         within {ms} ms; no payload was sent"
                    ),
                )
            })?;
        }
    }
    socket.set_read_timeout(None)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// What the kernel charges a socket's receive queue for one datagram
/// beside its bytes, at most: its `sk_buff` and shared info, rounded up by
/// the allocator (about 700 bytes on x86-64 Linux).
const QUEUED_DATAGRAM_OVERHEAD_BYTES: usize = 768;

/// Most bytes one server socket's receive queue is sized to on its own
/// (`--rcvbuf` aside).
const MAX_QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// The receive queue, in bytes, one of `workers` server sockets asks for so
/// that it holds a request of each of its flows at once, `flows` of
/// `size_bytes` in all: the flows' requests are stop-and-wait, one each in
/// flight, so a queue that holds them all drops none. Each socket gets
/// room for twice its even share, since the kernel steers flows by their
/// addresses, not evenly; the kernel doubles what is asked, which leaves
/// room for the re-sends of a busy host. At most [`MAX_QUEUE_BYTES`].
///
/// Without it, a few hundred flows overflow the kernel's default queue
/// (`net.core.rmem_default`) whenever the server falls behind: a request
/// that finds the queue full is lost, and the flows answered just before
/// fill the room again, so a flow can lose every re-send for seconds.
pub(super) fn queue_bytes(flows: usize, workers: usize, size_bytes: usize) -> usize {
    let share = flows.div_ceil(workers.max(1)).saturating_mul(2);
    share
        .saturating_mul(HEADER_BYTES + size_bytes + QUEUED_DATAGRAM_OVERHEAD_BYTES)
        .min(MAX_QUEUE_BYTES)
}

/// Raises `socket`'s receive queue to `bytes`: past `net.core.rmem_max`
/// where this process may (CAP_NET_ADMIN), else up to it. Never lowers it.
fn raise_queue(socket: &socket2::Socket, bytes: usize) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    // The kernel reports the doubled size it keeps.
    if socket.recv_buffer_size()? >= bytes.saturating_mul(2) {
        return Ok(());
    }
    match setsockopt(socket, sockopt::RcvBufForce, &bytes) {
        Ok(()) => Ok(()),
        Err(Errno::EPERM) => socket.set_recv_buffer_size(bytes),
        Err(e) => Err(e.into()),
    }
}

/// The server's sockets: `workers` UDP sockets on one port (SO_REUSEPORT),
/// so the kernel steers each flow, by its addresses, to one worker for its
/// whole life. Without `--rcvbuf` in `options`, each socket's receive
/// queue is raised to `queue` bytes when given ([`queue_bytes`]).
pub(super) fn bind(
    addr: SocketAddr,
    workers: usize,
    options: &TransportOptions,
    queue: Option<usize>,
) -> io::Result<Vec<UdpSocket>> {
    let one = |addr: SocketAddr| -> io::Result<UdpSocket> {
        let socket = udp_socket(addr, options)?;
        if let (None, Some(bytes)) = (options.rcvbuf_bytes, queue) {
            raise_queue(&socket, bytes)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        socket.set_nonblocking(true)?;
        Ok(socket.into())
    };
    let first = one(addr)?;
    let local = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..workers {
        sockets.push(one(local)?);
    }
    Ok(sockets)
}

/// One server worker: answers every datagram of its flows until `stop`,
/// sleeping in `epoll` (event mode) or spinning on the socket (poll mode);
/// with a `token`, only flows that proved it (see the module docs); with a
/// `rate` budget, charging every datagram received and sent to it and
/// leaving the socket's queue be while it is ahead. Every datagram it reads
/// is added to `received`, which the server's owner watches to see whether
/// clients are still at work.
pub(super) fn serve(
    socket: &UdpSocket,
    epoll: &Epoll,
    (size_bytes, layout, gauge): (usize, BufferLayout, &Arc<BufferGauge>),
    (mode, token, rate): (Mode, Option<DataToken>, Option<&crate::rate::RateBudget>),
    stop: &AtomicBool,
    received: &AtomicU64,
) -> Result<ServerTotals, EngineError> {
    // A secret per worker: the kernel steers a flow's hello and its
    // confirmation, from one address, to the same worker.
    let proof = match token {
        Some(token) => {
            let mut secret = [0u8; DATAGRAM_SECRET_BYTES];
            crate::random::fill_random(&mut secret).map_err(|source| EngineError::Sys {
                what: "drawing a udp flow server's secret".into(),
                source,
            })?;
            Some(DatagramListenerProof::new(token, secret))
        }
        None => None,
    };
    let mut server =
        Server::new(size_bytes, proof, layout, gauge).map_err(|e| EngineError::Sys {
            what: "allocating a udp flow server's datagram buffer".into(),
            source: io::Error::new(ErrorKind::OutOfMemory, e),
        })?;
    let mut events = [EpollEvent::empty(); 1];
    while !stop.load(Ordering::Relaxed) {
        super::io::wait_for_budget(rate, stop, Duration::from_millis(STOP_POLL_MS.into()));
        if mode == Mode::Event {
            match epoll.wait(&mut events, STOP_POLL_MS) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    return Err(EngineError::Sys {
                        what: "waiting in epoll".into(),
                        source: e.into(),
                    })
                }
            }
        }
        let read = server.drain(socket, rate);
        if read > 0 {
            received.fetch_add(read, Ordering::Relaxed);
        }
    }
    // What the worker's socket turned away (its receive queue full): the
    // first thing to overflow with many clients.
    server.stats.dropped = crate::udp::kernel_drops(socket).unwrap_or(0);
    Ok(server.totals())
}

/// Adds `socket` to `epoll` for reading.
pub(super) fn watch(epoll: &Epoll, socket: &UdpSocket) -> Result<(), EngineError> {
    epoll
        .add(socket, EpollEvent::new(EpollFlags::EPOLLIN, 0))
        .map_err(|e| EngineError::Sys {
            what: "adding a udp socket to epoll".into(),
            source: e.into(),
        })
}

/// A server worker's state: its flows' next sequence numbers and counts.
struct Server {
    /// Header, message (or a proof's hello, if longer) and one spare byte,
    /// which shows a datagram too long.
    buf: CountedBuffer,
    size_bytes: usize,
    /// Each flow's next new sequence number, by the flow's address; with a
    /// proof, only flows whose confirmation verified.
    peers: HashMap<SocketAddr, u64>,
    /// The session proof every flow passes before it is served, if any.
    proof: Option<DatagramListenerProof>,
    /// A control answer being sent: header and proof payload.
    reply: [u8; HEADER_BYTES + DATAGRAM_ANSWER_BYTES],
    totals: ServerTotals,
    stats: DatagramStats,
}

/// What to send back for one datagram.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Nothing.
    None,
    /// The first this many bytes of the server's `reply`.
    Reply(usize),
    /// The datagram itself, as a new reply or as a re-send.
    Echo {
        /// A re-send to a request already answered.
        again: bool,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::super::buffers::Side;
    use super::super::FlowWork;
    use super::*;
    use std::collections::VecDeque;

    /// A client worker's buffers for `size`-byte datagram flows.
    fn client_bufs(size: usize) -> WorkerBuffers {
        let work = FlowWork::PingPong { size_bytes: size };
        let gauge = Arc::new(BufferGauge::default());
        WorkerBuffers::for_work(work, Side::Client, true, BufferLayout::default(), &gauge).unwrap()
    }

    /// A server worker's state for `size`-byte messages.
    fn server(size: usize, proof: Option<DatagramListenerProof>) -> Server {
        let gauge = Arc::new(BufferGauge::default());
        Server::new(size, proof, BufferLayout::default(), &gauge).unwrap()
    }

    /// A scripted datagram socket: each read returns one queued datagram
    /// (an empty queue would block); writes are kept, or refused as a full
    /// buffer while `full`.
    #[derive(Default)]
    struct Script {
        reads: VecDeque<Vec<u8>>,
        written: Vec<Vec<u8>>,
        full: bool,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let d = self.reads.pop_front().ok_or(ErrorKind::WouldBlock)?;
            let n = d.len().min(buf.len());
            buf[..n].copy_from_slice(&d[..n]);
            Ok(n)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.full {
                return Err(ErrorKind::WouldBlock.into());
            }
            self.written.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn data(seq: u64, size: usize) -> Vec<u8> {
        let h = Header {
            kind: Kind::Data,
            flags: 0,
            seq,
            offset_bytes: seq * size as u64,
        };
        let mut d = h.encode().to_vec();
        d.resize(HEADER_BYTES + size, 7);
        d
    }

    fn seq_of(d: &[u8]) -> u64 {
        Header::decode(d).unwrap().seq
    }

    /// The second cause of 2,000 udp clients failing: the server's
    /// sockets kept the kernel's default receive queue, which holds a few
    /// hundred requests, so flows starved behind it. Each socket now holds
    /// twice its share of the flows' requests, `--rcvbuf` aside.
    #[test]
    fn a_server_socket_queues_a_request_of_each_of_its_flows() {
        let per = HEADER_BYTES + 1 + QUEUED_DATAGRAM_OVERHEAD_BYTES;
        assert_eq!(queue_bytes(2000, 2, 1), 2000 * per);
        assert_eq!(queue_bytes(3, 2, 1), 4 * per);
        assert_eq!(queue_bytes(1, 0, 1), 2 * per);
        assert_eq!(queue_bytes(1 << 20, 1, MAX_MESSAGE_BYTES), MAX_QUEUE_BYTES);
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let options = TransportOptions::default();
        let asked = queue_bytes(2000, 2, 1);
        let sockets = bind(addr, 2, &options, Some(asked)).unwrap();
        for s in &sockets {
            let got = socket2::SockRef::from(s).recv_buffer_size().unwrap();
            // All of it as root; else what net.core.rmem_max allows, and
            // never less than before.
            assert!(got >= 2 * asked || got >= 2 * 212_992.min(asked), "{got}");
        }
        // `--rcvbuf` stands as given.
        let options = TransportOptions {
            rcvbuf_bytes: Some(64 * 1024),
            ..TransportOptions::default()
        };
        let sockets = bind(addr, 1, &options, Some(asked)).unwrap();
        let got = socket2::SockRef::from(&sockets[0])
            .recv_buffer_size()
            .unwrap();
        assert_eq!(got, 2 * 64 * 1024);
    }

    #[test]
    fn a_round_trip_is_one_datagram_each_way() {
        let mut m = DatagramClient::new(3);
        let wb = &mut client_bufs(3);
        let mut io = Script::default();
        m.start(&mut io, wb).unwrap();
        assert_eq!(io.written.len(), 1);
        assert_eq!(io.written[0].len(), HEADER_BYTES + 3);
        assert_eq!(seq_of(&io.written[0]), 0);
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::WantRead);
        io.reads.push_back(data(0, 3));
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::Done);
        assert!(!m.waiting());
        m.start(&mut io, wb).unwrap();
        assert_eq!(seq_of(&io.written[1]), 1);
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 6,
                rx_bytes: 3
            }
        );
        assert_eq!((m.stats.datagrams_sent, m.stats.datagrams_received), (2, 1));
    }

    #[test]
    fn a_resend_repeats_the_request_and_a_late_reply_is_a_duplicate() {
        let mut m = DatagramClient::new(1);
        let wb = &mut client_bufs(1);
        let mut io = Script::default();
        m.start(&mut io, wb).unwrap();
        m.resend(&mut io, wb).unwrap();
        assert_eq!(io.written.len(), 2);
        assert_eq!(seq_of(&io.written[1]), 0);
        assert_eq!(Header::decode(&io.written[1]).unwrap().flags, FLAG_RETRY);
        // Both copies are answered: the first completes the round trip.
        io.reads.push_back(data(0, 1));
        io.reads.push_back(data(0, 1));
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::Done);
        assert!(m.retried());
        m.start(&mut io, wb).unwrap();
        // The second answer to request 0 is not taken for request 1's.
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::WantRead);
        assert!(m.waiting());
        io.reads.push_back(data(1, 1));
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::Done);
        assert_eq!(m.stats.retries, 1);
        assert_eq!(m.stats.duplicates, 1);
        assert_eq!(m.moved.tx_bytes, m.moved.rx_bytes);
    }

    #[test]
    fn a_full_socket_buffer_drops_the_request_but_counts_its_bytes() {
        let mut m = DatagramClient::new(2);
        let wb = &mut client_bufs(2);
        let mut io = Script {
            full: true,
            ..Script::default()
        };
        m.start(&mut io, wb).unwrap();
        assert_eq!((m.stats.datagrams_sent, m.moved.tx_bytes), (0, 2));
        io.full = false;
        m.resend(&mut io, wb).unwrap();
        assert_eq!((m.stats.datagrams_sent, m.stats.retries), (1, 1));
    }

    #[test]
    fn strangers_are_ignored_and_a_broken_server_is_an_error() {
        let mut m = DatagramClient::new(2);
        let wb = &mut client_bufs(2);
        let mut io = Script::default();
        m.start(&mut io, wb).unwrap();
        io.reads.push_back(vec![]);
        io.reads.push_back(b"junk".to_vec());
        io.reads
            .push_back(Header::control(Kind::HelloAck).encode().to_vec());
        assert_eq!(m.pump(&mut io, wb).unwrap(), Progress::WantRead);
        assert_eq!(m.stats.datagrams_received, 0);
        // A reply to a request never sent.
        io.reads.push_back(data(5, 2));
        assert!(matches!(m.pump(&mut io, wb), Err(MachineError::Unexpected)));
        // The current request's reply with the wrong size.
        let mut m = DatagramClient::new(2);
        m.start(&mut io, wb).unwrap();
        io.reads.push_back(data(0, 3));
        assert!(matches!(m.pump(&mut io, wb), Err(MachineError::Unexpected)));
    }

    #[test]
    fn the_retry_queue_gives_due_slots_in_order() {
        let t0 = Instant::now();
        let mut q = RetryQueue::default();
        q.push(t0 + Duration::from_millis(5), 1);
        q.push(t0 + Duration::from_millis(1), 2);
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(1)));
        assert_eq!(q.pop_due(t0), None);
        assert_eq!(q.pop_due(t0 + Duration::from_millis(3)), Some(2));
        assert_eq!(q.pop_due(t0 + Duration::from_millis(3)), None);
        assert_eq!(q.pop_due(t0 + Duration::from_millis(9)), Some(1));
        assert_eq!(q.next_due(), None);
    }

    fn arrive(s: &mut Server, d: &[u8], from: SocketAddr) -> Answer {
        s.buf[..d.len()].copy_from_slice(d);
        s.answer(d.len(), from)
    }

    #[test]
    fn the_server_answers_each_request_and_counts_a_repeat_once() {
        let mut s = server(4, None);
        let a: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let b: SocketAddr = "10.0.0.1:5001".parse().unwrap();
        // Data before the hello is a stranger's.
        assert_eq!(arrive(&mut s, &data(0, 4), a), Answer::None);
        let hello = Header::control(Kind::Hello).encode();
        assert_eq!(arrive(&mut s, &hello, a), Answer::Reply(HEADER_BYTES));
        assert_eq!(arrive(&mut s, &hello, a), Answer::Reply(HEADER_BYTES));
        assert_eq!(arrive(&mut s, &hello, b), Answer::Reply(HEADER_BYTES));
        assert_eq!(
            arrive(&mut s, &data(0, 4), a),
            Answer::Echo { again: false }
        );
        assert_eq!(arrive(&mut s, &data(0, 4), a), Answer::Echo { again: true });
        assert_eq!(
            arrive(&mut s, &data(0, 4), b),
            Answer::Echo { again: false }
        );
        // Wrong size, and garbage: counted, never answered.
        assert_eq!(arrive(&mut s, &data(1, 5), a), Answer::None);
        assert_eq!(arrive(&mut s, b"NGxx", a), Answer::None);
        // A gap: request 1 never came.
        assert_eq!(
            arrive(&mut s, &data(2, 4), a),
            Answer::Echo { again: false }
        );
        let t = s.totals();
        assert_eq!(t.connections_accepted, 2);
        assert_eq!((t.bytes_rx, t.bytes_tx), (12, 12));
        assert_eq!(t.errors, 3);
        let d = t.datagrams.unwrap();
        assert_eq!((d.datagrams_received, d.duplicates), (4, 1));
        assert_eq!((d.lost, d.lost_bytes), (1, 4));
    }

    fn token(b: u8) -> DataToken {
        DataToken::from_bytes([b; 32])
    }

    /// A server of 4-byte messages proving `token`.
    fn proven_server(t: u8) -> Server {
        server(
            4,
            Some(DatagramListenerProof::new(
                token(t),
                [9; DATAGRAM_SECRET_BYTES],
            )),
        )
    }

    fn framed_vec(kind: Kind, payload: &[u8]) -> Vec<u8> {
        let mut d = Header::control(kind).encode().to_vec();
        d.extend_from_slice(payload);
        d
    }

    /// The server's reply to the last datagram, header and payload.
    fn reply(s: &Server, a: Answer) -> (Header, Vec<u8>) {
        let Answer::Reply(len) = a else {
            panic!("expected a reply, got {a:?}")
        };
        (
            Header::decode(&s.reply[..len]).unwrap(),
            s.reply[HEADER_BYTES..len].to_vec(),
        )
    }

    #[test]
    fn a_proven_server_keeps_nothing_for_hellos_and_serves_a_flow_once_it_confirms() {
        let mut s = proven_server(1);
        let c = DatagramConnectorProof::new(token(1), [2; NONCE_BYTES]);
        let hello = framed_vec(Kind::Hello, &c.hello());
        // A flood of hellos from as many addresses: each answered with no
        // more bytes than it carried, none kept.
        for i in 0..2000u32 {
            let from = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)), 4000);
            let a = arrive(&mut s, &hello, from);
            let (h, payload) = reply(&s, a);
            assert_eq!(h.kind, Kind::HelloAck);
            assert!(HEADER_BYTES + payload.len() <= hello.len());
            // Their data is dropped unanswered.
            assert_eq!(arrive(&mut s, &data(0, 4), from), Answer::None);
        }
        assert_eq!((s.peers.len(), s.peers.capacity()), (0, 0));
        // One of them completes the proof and is served from then on.
        let from: SocketAddr = "10.0.0.7:4000".parse().unwrap();
        let a = arrive(&mut s, &hello, from);
        let (_, answer) = reply(&s, a);
        let confirm = c.on_answer(&answer).unwrap();
        let confirm = framed_vec(Kind::Confirm, &confirm);
        let a = arrive(&mut s, &confirm, from);
        assert_eq!(reply(&s, a), (Header::control(Kind::ConfirmAck), vec![]));
        // A lost confirm-ack is asked for again; the flow counts once.
        let a = arrive(&mut s, &confirm, from);
        assert_eq!(reply(&s, a).0.kind, Kind::ConfirmAck);
        assert_eq!(s.peers.len(), 1);
        assert_eq!(
            arrive(&mut s, &data(0, 4), from),
            Answer::Echo { again: false }
        );
        let t = s.totals();
        assert_eq!(t.connections_accepted, 1);
        assert_eq!((t.strangers, t.errors), (2000, 2000));
        assert_eq!((t.bytes_rx, t.bytes_tx), (4, 4));
    }

    #[test]
    fn a_proven_server_answers_no_stranger_and_registers_no_forged_confirm() {
        let mut s = proven_server(1);
        let from: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        // A client of another point: answered (the hello alone cannot
        // tell), but the answer fails its check and its confirm is forged.
        let other = DatagramConnectorProof::new(token(2), [2; NONCE_BYTES]);
        let a = arrive(&mut s, &framed_vec(Kind::Hello, &other.hello()), from);
        let (_, answer) = reply(&s, a);
        assert!(other.on_answer(&answer).is_err());
        let mut forged = [0u8; DATAGRAM_CONFIRM_BYTES];
        forged[..NONCE_BYTES].copy_from_slice(&[2; NONCE_BYTES]);
        assert_eq!(
            arrive(&mut s, &framed_vec(Kind::Confirm, &forged), from),
            Answer::None
        );
        // A good confirmation replayed from another address.
        let c = DatagramConnectorProof::new(token(1), [3; NONCE_BYTES]);
        let a = arrive(&mut s, &framed_vec(Kind::Hello, &c.hello()), from);
        let confirm = c.on_answer(&reply(&s, a).1).unwrap();
        let elsewhere: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        assert_eq!(
            arrive(&mut s, &framed_vec(Kind::Confirm, &confirm), elsewhere),
            Answer::None
        );
        // A hello without the proof (a client with no token), one cut
        // short, and data: none answered.
        let bare = Header::control(Kind::Hello).encode();
        assert_eq!(arrive(&mut s, &bare, from), Answer::None);
        assert_eq!(
            arrive(&mut s, &framed_vec(Kind::Hello, &c.hello()[..20]), from),
            Answer::None
        );
        assert_eq!(arrive(&mut s, &data(0, 4), from), Answer::None);
        assert_eq!(arrive(&mut s, &data(0, 4), elsewhere), Answer::None);
        assert_eq!((s.peers.len(), s.peers.capacity()), (0, 0));
        let t = s.totals();
        assert_eq!((t.strangers, t.connections_accepted, t.bytes_tx), (6, 0, 0));
        // A server without a token takes no confirmation either.
        let mut plain = server(4, None);
        assert_eq!(
            arrive(&mut plain, &framed_vec(Kind::Confirm, &confirm), from),
            Answer::None
        );
        assert!(plain.peers.is_empty());
    }

    #[test]
    fn the_server_keeps_state_for_a_bounded_number_of_peers() {
        let mut s = server(1, None);
        let hello = Header::control(Kind::Hello).encode();
        for i in 0..MAX_PEERS_PER_WORKER {
            let from = SocketAddr::new(
                IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + (i as u32 >> 8))),
                1024 + (i % 256) as u16,
            );
            assert_eq!(arrive(&mut s, &hello, from), Answer::Reply(HEADER_BYTES));
        }
        let extra: SocketAddr = "192.0.2.1:9".parse().unwrap();
        assert_eq!(arrive(&mut s, &hello, extra), Answer::None);
        assert_eq!(s.peers.len(), MAX_PEERS_PER_WORKER);
        assert_eq!(s.totals().errors, 1);
    }
}
