//! The per-flow state machines of the flow engine: plain code over any
//! `Read + Write` that does no waiting of its own. A worker calls `pump`
//! whenever epoll says the flow's socket is ready; the machine moves as many
//! bytes as the socket takes without blocking and says what it waits for
//! next ([`Progress`]), so partial reads and writes are handled in one
//! place and tests drive the machines in memory with a scripted socket.
//! A machine holds offsets and counters; it sends from and reads into its
//! worker's buffers ([`WorkerBuffers`]), which the worker hands to the flow
//! it pumps, so a flow holds no message bytes and a round trip allocates
//! nothing. Only an echo the socket did not take whole gets a buffer of
//! the flow's own, once, for the rest of the flow's life.

use super::buffers::{connect_chunk_bytes, CountedBuffer, WorkerBuffers};
use super::io::Io;
use std::io::{self, ErrorKind, Read, Write};

/// What a machine waits for after a `pump`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The socket would block on a read: wait until it is readable.
    WantRead,
    /// The socket would block on a write: wait until it is writable.
    WantWrite,
    /// The exchange finished (a round trip, a request served, a connection's
    /// reply and end of stream received).
    Done,
}

/// Why a machine stopped with an error. Never caused by a panic: every
/// peer behaviour maps to one of these.
#[derive(Debug)]
pub(crate) enum MachineError {
    /// The peer closed the connection in the middle of an exchange.
    Closed,
    /// The peer sent bytes the exchange does not allow (more than the
    /// reply, or data after it).
    Unexpected,
    /// A read or write failed.
    Io(io::Error),
}

impl std::fmt::Display for MachineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MachineError::Closed => write!(f, "the peer closed the connection mid-exchange"),
            MachineError::Unexpected => {
                write!(f, "the peer sent more bytes than the exchange allows")
            }
            MachineError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Reads into `buf`, retrying on EINTR. `Ok(None)` means it would block.
fn read_some(io: &mut impl Read, buf: &mut [u8]) -> Result<Option<usize>, io::Error> {
    loop {
        match io.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Writes from `buf`, retrying on EINTR. `Ok(None)` means it would block.
fn write_some(io: &mut impl Write, buf: &[u8]) -> Result<Option<usize>, io::Error> {
    loop {
        match io.write(buf) {
            Ok(0) => {
                return Err(io::Error::new(
                    ErrorKind::WriteZero,
                    "socket accepted no bytes",
                ))
            }
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Byte counters every machine keeps: everything it moved, whole run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Bytes written to the socket.
    pub tx_bytes: u64,
    /// Bytes read from the socket.
    pub rx_bytes: u64,
}

/// The client side of one pingpong flow: send `size` bytes, read `size`
/// bytes back, repeat on [`PingPongClient::start`]. It sends from its
/// worker's send buffer and reads into its receive buffer, both at least
/// `size` bytes.
#[derive(Debug)]
pub(crate) struct PingPongClient {
    /// The message size; at least 1.
    size: usize,
    /// Bytes of the current message already written (while `sending`) or
    /// read (otherwise).
    off: usize,
    sending: bool,
    /// Whether a round trip is under way.
    busy: bool,
    pub moved: Moved,
}

impl PingPongClient {
    /// A machine for `size_bytes`-byte round trips (`size_bytes >= 1`).
    pub(super) fn new(size_bytes: usize) -> PingPongClient {
        PingPongClient {
            size: size_bytes.max(1),
            off: 0,
            sending: false,
            busy: false,
            moved: Moved::default(),
        }
    }

    /// The message size, bytes.
    pub(super) fn size_bytes(&self) -> usize {
        self.size
    }

    /// Whether a round trip is under way (started and not yet `Done`).
    pub(super) fn busy(&self) -> bool {
        self.busy
    }

    /// Begins a round trip and moves what it can.
    pub(super) fn start(
        &mut self,
        io: &mut (impl Read + Write),
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        self.busy = true;
        self.sending = true;
        self.off = 0;
        self.pump(io, bufs)
    }

    /// Moves bytes of the current round trip until the socket would block or
    /// the round trip completes. With no round trip under way, any readable
    /// byte or end of stream is the peer misbehaving or going away.
    pub(super) fn pump(
        &mut self,
        io: &mut (impl Read + Write),
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        if !self.busy {
            let mut probe = [0u8; 1];
            return match read_some(io, &mut probe).map_err(MachineError::Io)? {
                None => Ok(Progress::WantRead),
                Some(0) => Err(MachineError::Closed),
                Some(_) => Err(MachineError::Unexpected),
            };
        }
        let size = self.size;
        loop {
            if self.sending {
                match write_some(io, &bufs.send[self.off..size]).map_err(MachineError::Io)? {
                    None => return Ok(Progress::WantWrite),
                    Some(n) => {
                        self.off += n;
                        self.moved.tx_bytes += n as u64;
                        if self.off == size {
                            self.sending = false;
                            self.off = 0;
                            // The reply cannot be in yet; trying to read now
                            // would cost a system call that nearly always
                            // finds nothing. Epoll says when it arrives.
                            return Ok(Progress::WantRead);
                        }
                    }
                }
            } else {
                // The reply's bytes are not looked at: where in the worker's
                // buffer they land is of no matter.
                match read_some(io, &mut bufs.recv[self.off..size]).map_err(MachineError::Io)? {
                    None => return Ok(Progress::WantRead),
                    Some(0) => return Err(MachineError::Closed),
                    Some(n) => {
                        self.off += n;
                        self.moved.rx_bytes += n as u64;
                        if self.off == size {
                            self.busy = false;
                            return Ok(Progress::Done);
                        }
                    }
                }
            }
        }
    }
}

/// The server side of one pingpong flow: echo every byte back, at most
/// `size` bytes in flight, until the client closes.
///
/// It reads into its worker's receive buffer and writes the bytes straight
/// back from there. What the socket does not take at once is kept in a
/// buffer of the flow's own (`size` bytes at the worker's layout, made the
/// first time and kept), into which the flow then reads, so an echo held
/// back is never overwritten by the worker's other flows.
#[derive(Debug)]
pub(crate) struct EchoServer {
    /// The message size; at least 1.
    size: usize,
    /// The flow's own buffer, once an echo had to wait for the socket.
    own: Option<CountedBuffer>,
    /// Bytes of `own[..len]` already written back; `len == 0` while reading.
    off: usize,
    len: usize,
    pub moved: Moved,
}

impl EchoServer {
    /// An echo machine for messages of `size_bytes` (`size_bytes >= 1`),
    /// whose worker's receive buffer holds at least that.
    pub(super) fn new(size_bytes: usize) -> EchoServer {
        EchoServer {
            size: size_bytes.max(1),
            own: None,
            off: 0,
            len: 0,
            moved: Moved::default(),
        }
    }

    /// Whether the flow holds a buffer of its own.
    #[cfg(test)]
    pub(super) fn holds_a_buffer(&self) -> bool {
        self.own.is_some()
    }

    /// Echoes until the socket would block. `Done` means the client closed
    /// the connection cleanly between messages.
    pub(super) fn pump(
        &mut self,
        io: &mut (impl Read + Write),
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        loop {
            if let Some(own) = self.own.as_mut() {
                if self.len == 0 {
                    match read_some(io, &mut own[..self.size]).map_err(MachineError::Io)? {
                        None => return Ok(Progress::WantRead),
                        Some(0) => return Ok(Progress::Done),
                        Some(n) => {
                            self.moved.rx_bytes += n as u64;
                            self.len = n;
                            self.off = 0;
                        }
                    }
                    continue;
                }
                match write_some(io, &own[self.off..self.len]).map_err(MachineError::Io)? {
                    None => return Ok(Progress::WantWrite),
                    Some(n) => {
                        self.moved.tx_bytes += n as u64;
                        self.off += n;
                        if self.off == self.len {
                            self.len = 0;
                            // The client waits for this echo before sending
                            // more, so reading now would only find nothing.
                            return Ok(Progress::WantRead);
                        }
                    }
                }
                continue;
            }
            let n = match read_some(io, &mut bufs.recv[..self.size]).map_err(MachineError::Io)? {
                None => return Ok(Progress::WantRead),
                Some(0) => return Ok(Progress::Done),
                Some(n) => n,
            };
            self.moved.rx_bytes += n as u64;
            let taken = write_some(io, &bufs.recv[..n])
                .map_err(MachineError::Io)?
                .unwrap_or(0);
            self.moved.tx_bytes += taken as u64;
            if taken == n {
                // As above: nothing more can be there yet.
                return Ok(Progress::WantRead);
            }
            // The rest must outlive this pump: the worker's buffer is the
            // next flow's.
            let mut own = bufs
                .flow_buffer(self.size)
                .map_err(|e| MachineError::Io(io::Error::new(ErrorKind::OutOfMemory, e)))?;
            own[..n - taken].copy_from_slice(&bufs.recv[taken..n]);
            self.own = Some(own);
            self.off = 0;
            self.len = n - taken;
        }
    }
}

/// The server side of a flow, whatever its work: what a server worker
/// pumps when the flow's socket is ready.
pub(crate) trait ServerMachine: Send {
    /// Moves bytes through the worker's `bufs` until the socket would
    /// block; `Done` means the caller closes the connection now.
    fn pump(&mut self, io: &mut Io<'_>, bufs: &mut WorkerBuffers)
        -> Result<Progress, MachineError>;
    /// What the flow moved so far.
    fn moved(&self) -> Moved;
}

impl ServerMachine for EchoServer {
    fn pump(
        &mut self,
        io: &mut Io<'_>,
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        EchoServer::pump(self, io, bufs)
    }
    fn moved(&self) -> Moved {
        self.moved
    }
}

impl ServerMachine for ConnectServer {
    fn pump(
        &mut self,
        io: &mut Io<'_>,
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        ConnectServer::pump(self, io, bufs)
    }
    fn moved(&self) -> Moved {
        self.moved
    }
}

/// Phases of one connect-mode exchange, client side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectPhase {
    Sending,
    Receiving,
    /// The reply is in; waiting for the server's end of stream, so the
    /// server closes first and TIME_WAIT stays on its side.
    AwaitEof,
    Finished,
}

/// The client side of one connect-mode connection once it is established:
/// send the request, read the reply, then wait for the server to close.
/// `reply_received` says when the timed part (setup and exchange) ended.
#[derive(Debug)]
pub(crate) struct ConnectClient {
    /// The most bytes one read or write moves: its worker's buffers hold at
    /// least this (at least 1); requests and replies longer than it go in
    /// pieces.
    chunk: usize,
    request_bytes: usize,
    reply_bytes: usize,
    /// Bytes of the current phase done.
    done: usize,
    phase: ConnectPhase,
    pub moved: Moved,
}

impl ConnectClient {
    /// A machine for `request_bytes` out and `reply_bytes` back.
    pub(super) fn new(request_bytes: usize, reply_bytes: usize) -> ConnectClient {
        ConnectClient {
            chunk: connect_chunk_bytes(request_bytes, reply_bytes),
            request_bytes,
            reply_bytes,
            done: 0,
            phase: ConnectPhase::Finished,
            moved: Moved::default(),
        }
    }

    /// Resets for a new connection that has just been established.
    pub(super) fn begin(&mut self) {
        self.done = 0;
        self.phase = if self.request_bytes > 0 {
            ConnectPhase::Sending
        } else if self.reply_bytes > 0 {
            ConnectPhase::Receiving
        } else {
            ConnectPhase::AwaitEof
        };
    }

    /// The request and reply sizes, bytes.
    pub(super) fn sizes_bytes(&self) -> (usize, usize) {
        (self.request_bytes, self.reply_bytes)
    }

    /// Whether the whole reply has arrived (the end of the timed part).
    pub(super) fn reply_received(&self) -> bool {
        matches!(self.phase, ConnectPhase::AwaitEof | ConnectPhase::Finished)
    }

    /// Moves bytes until the socket would block; `Done` once the server
    /// closed after the full reply.
    pub(super) fn pump(
        &mut self,
        io: &mut (impl Read + Write),
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        loop {
            match self.phase {
                ConnectPhase::Sending => {
                    let want = (self.request_bytes - self.done).min(self.chunk);
                    match write_some(io, &bufs.send[..want]).map_err(MachineError::Io)? {
                        None => return Ok(Progress::WantWrite),
                        Some(n) => {
                            self.done += n;
                            self.moved.tx_bytes += n as u64;
                            if self.done == self.request_bytes {
                                self.done = 0;
                                self.phase = if self.reply_bytes > 0 {
                                    ConnectPhase::Receiving
                                } else {
                                    ConnectPhase::AwaitEof
                                };
                                // The reply cannot be in yet: wait for epoll
                                // rather than try a read that finds nothing.
                                return Ok(Progress::WantRead);
                            }
                        }
                    }
                }
                ConnectPhase::Receiving => {
                    let want = (self.reply_bytes - self.done).min(self.chunk);
                    match read_some(io, &mut bufs.recv[..want]).map_err(MachineError::Io)? {
                        None => return Ok(Progress::WantRead),
                        Some(0) => return Err(MachineError::Closed),
                        Some(n) => {
                            self.done += n;
                            self.moved.rx_bytes += n as u64;
                            if self.done == self.reply_bytes {
                                self.phase = ConnectPhase::AwaitEof;
                            }
                        }
                    }
                }
                ConnectPhase::AwaitEof => {
                    let mut probe = [0u8; 1];
                    match read_some(io, &mut probe).map_err(MachineError::Io)? {
                        None => return Ok(Progress::WantRead),
                        Some(0) => {
                            self.phase = ConnectPhase::Finished;
                            return Ok(Progress::Done);
                        }
                        Some(_) => return Err(MachineError::Unexpected),
                    }
                }
                ConnectPhase::Finished => return Ok(Progress::Done),
            }
        }
    }
}

/// The server side of one connect-mode connection: read the request,
/// write the reply; `Done` means the caller closes the socket now (the
/// server closes first).
#[derive(Debug)]
pub(crate) struct ConnectServer {
    /// As [`ConnectClient`]'s.
    chunk: usize,
    request_bytes: usize,
    reply_bytes: usize,
    done: usize,
    replying: bool,
    pub moved: Moved,
}

impl ConnectServer {
    /// A machine expecting `request_bytes` and answering `reply_bytes`.
    pub(super) fn new(request_bytes: usize, reply_bytes: usize) -> ConnectServer {
        ConnectServer {
            chunk: connect_chunk_bytes(request_bytes, reply_bytes),
            request_bytes,
            reply_bytes,
            done: 0,
            replying: request_bytes == 0,
            moved: Moved::default(),
        }
    }

    /// Moves bytes until the socket would block or the reply is out.
    pub(super) fn pump(
        &mut self,
        io: &mut (impl Read + Write),
        bufs: &mut WorkerBuffers,
    ) -> Result<Progress, MachineError> {
        loop {
            if !self.replying {
                let want = (self.request_bytes - self.done).min(self.chunk);
                match read_some(io, &mut bufs.recv[..want]).map_err(MachineError::Io)? {
                    None => return Ok(Progress::WantRead),
                    Some(0) => return Err(MachineError::Closed),
                    Some(n) => {
                        self.done += n;
                        self.moved.rx_bytes += n as u64;
                        if self.done == self.request_bytes {
                            self.done = 0;
                            self.replying = true;
                        }
                    }
                }
            } else {
                if self.done == self.reply_bytes {
                    return Ok(Progress::Done);
                }
                let want = (self.reply_bytes - self.done).min(self.chunk);
                match write_some(io, &bufs.send[..want]).map_err(MachineError::Io)? {
                    None => return Ok(Progress::WantWrite),
                    Some(n) => {
                        self.done += n;
                        self.moved.tx_bytes += n as u64;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::super::buffers::{BufferGauge, Side};
    use super::super::FlowWork;
    use super::*;
    use crate::buffer::BufferLayout;
    use std::collections::VecDeque;
    use std::sync::Arc;

    /// A worker's buffers for `work` on `side`, at the default layout.
    fn bufs(work: FlowWork, side: Side) -> WorkerBuffers {
        let gauge = Arc::new(BufferGauge::default());
        WorkerBuffers::for_work(work, side, false, BufferLayout::default(), &gauge).unwrap()
    }

    fn pingpong(size_bytes: usize) -> FlowWork {
        FlowWork::PingPong { size_bytes }
    }

    fn connect(request_bytes: usize, reply_bytes: usize) -> FlowWork {
        FlowWork::Connect {
            request_bytes,
            reply_bytes,
        }
    }

    /// A scripted socket: reads return the queued chunks (an empty queue
    /// would block, `Some(vec![])` is end of stream); writes accept at most
    /// `write_budget` bytes in total before blocking.
    #[derive(Default)]
    struct Script {
        reads: VecDeque<Vec<u8>>,
        eof: bool,
        write_budget: usize,
        written: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.reads.front_mut() {
                Some(chunk) => {
                    let n = chunk.len().min(buf.len());
                    buf[..n].copy_from_slice(&chunk[..n]);
                    chunk.drain(..n);
                    if chunk.is_empty() {
                        self.reads.pop_front();
                    }
                    Ok(n)
                }
                None if self.eof => Ok(0),
                None => Err(ErrorKind::WouldBlock.into()),
            }
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.write_budget == 0 {
                return Err(ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.write_budget);
            self.write_budget -= n;
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn pingpong_client_handles_partial_writes_and_reads() {
        let mut m = PingPongClient::new(10);
        let b = &mut bufs(pingpong(10), Side::Client);
        let mut io = Script {
            write_budget: 4,
            ..Script::default()
        };
        assert_eq!(m.start(&mut io, b).unwrap(), Progress::WantWrite);
        io.write_budget = 100;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert_eq!(io.written.len(), 10);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        io.reads.push_back(vec![0; 3]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert!(m.busy());
        io.reads.push_back(vec![0; 7]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::Done);
        assert!(!m.busy());
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 10,
                rx_bytes: 10
            }
        );
    }

    #[test]
    fn pingpong_client_reports_peer_close_mid_round_trip() {
        let mut m = PingPongClient::new(4);
        let b = &mut bufs(pingpong(4), Side::Client);
        let mut io = Script {
            write_budget: 100,
            ..Script::default()
        };
        io.reads.push_back(vec![0; 2]);
        io.eof = true;
        assert_eq!(m.start(&mut io, b).unwrap(), Progress::WantRead);
        assert!(matches!(m.pump(&mut io, b), Err(MachineError::Closed)));
    }

    #[test]
    fn idle_pingpong_client_treats_data_as_unexpected() {
        let mut m = PingPongClient::new(4);
        let b = &mut bufs(pingpong(4), Side::Client);
        let mut io = Script::default();
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        io.reads.push_back(vec![1]);
        assert!(matches!(m.pump(&mut io, b), Err(MachineError::Unexpected)));
    }

    #[test]
    fn echo_server_echoes_in_pieces_and_finishes_on_eof() {
        let mut m = EchoServer::new(4);
        let b = &mut bufs(pingpong(4), Side::Server);
        let mut io = Script {
            write_budget: 3,
            ..Script::default()
        };
        io.reads.push_back(b"abcdef".to_vec());
        // Reads 4, can write 3 of them back.
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantWrite);
        io.write_budget = 100;
        // The first 4 echoed; then the remaining 2 read and echoed.
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert_eq!(io.written, b"abcdef");
        io.eof = true;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::Done);
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 6,
                rx_bytes: 6
            }
        );
    }

    #[test]
    fn connect_client_sends_request_reads_reply_then_waits_for_server_close() {
        let mut m = ConnectClient::new(5, 3);
        let b = &mut bufs(connect(5, 3), Side::Client);
        m.begin();
        let mut io = Script {
            write_budget: 2,
            ..Script::default()
        };
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantWrite);
        io.write_budget = 100;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        io.reads.push_back(vec![9; 3]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert!(m.reply_received());
        io.eof = true;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::Done);
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 5,
                rx_bytes: 3
            }
        );
    }

    #[test]
    fn connect_client_refuses_extra_reply_bytes() {
        let mut m = ConnectClient::new(1, 2);
        let b = &mut bufs(connect(1, 2), Side::Client);
        m.begin();
        let mut io = Script {
            write_budget: 100,
            ..Script::default()
        };
        io.reads.push_back(vec![0; 3]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert!(matches!(m.pump(&mut io, b), Err(MachineError::Unexpected)));
    }

    #[test]
    fn connect_client_reports_close_before_reply() {
        let mut m = ConnectClient::new(1, 2);
        let b = &mut bufs(connect(1, 2), Side::Client);
        m.begin();
        let mut io = Script {
            write_budget: 100,
            eof: true,
            ..Script::default()
        };
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert!(matches!(m.pump(&mut io, b), Err(MachineError::Closed)));
        assert!(!m.reply_received());
    }

    #[test]
    fn connect_server_reads_request_then_writes_reply() {
        let mut m = ConnectServer::new(3, 100_000);
        let b = &mut bufs(connect(3, 100_000), Side::Server);
        let mut io = Script {
            write_budget: 70_000,
            ..Script::default()
        };
        io.reads.push_back(vec![1; 2]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        io.reads.push_back(vec![1; 1]);
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantWrite);
        io.write_budget = 30_000;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::Done);
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 100_000,
                rx_bytes: 3
            }
        );
    }

    #[test]
    fn pingpong_clients_sharing_a_worker_each_send_their_whole_message() {
        let b = &mut bufs(pingpong(10), Side::Client);
        let (mut a, mut c) = (PingPongClient::new(10), PingPongClient::new(10));
        let mut io_a = Script {
            write_budget: 3,
            ..Script::default()
        };
        let mut io_c = Script {
            write_budget: 100,
            ..Script::default()
        };
        assert_eq!(a.start(&mut io_a, b).unwrap(), Progress::WantWrite);
        assert_eq!(c.start(&mut io_c, b).unwrap(), Progress::WantRead);
        // The other flow's reply lands in the worker's buffer meanwhile.
        io_c.reads.push_back(vec![0xee; 10]);
        assert_eq!(c.pump(&mut io_c, b).unwrap(), Progress::Done);
        io_a.write_budget = 100;
        assert_eq!(a.pump(&mut io_a, b).unwrap(), Progress::WantRead);
        let pattern: Vec<u8> = (0..10).collect();
        assert_eq!(io_a.written, pattern);
        assert_eq!(io_c.written, pattern);
    }

    #[test]
    fn an_echo_held_back_keeps_its_bytes_while_other_flows_use_the_worker_buffers() {
        let gauge = Arc::new(BufferGauge::default());
        let b = &mut WorkerBuffers::for_work(
            pingpong(4),
            Side::Server,
            false,
            BufferLayout::default(),
            &gauge,
        )
        .unwrap();
        let shared = gauge.held_bytes();
        let (mut a, mut c) = (EchoServer::new(4), EchoServer::new(4));
        let mut io_a = Script {
            write_budget: 2,
            ..Script::default()
        };
        io_a.reads.push_back(b"abcd".to_vec());
        assert_eq!(a.pump(&mut io_a, b).unwrap(), Progress::WantWrite);
        assert!(a.holds_a_buffer());
        assert!(gauge.held_bytes() > shared);
        // Another flow's echo goes through the worker's buffer whole.
        let mut io_c = Script {
            write_budget: 100,
            ..Script::default()
        };
        io_c.reads.push_back(b"wxyz".to_vec());
        assert_eq!(c.pump(&mut io_c, b).unwrap(), Progress::WantRead);
        assert!(!c.holds_a_buffer());
        assert_eq!(io_c.written, b"wxyz");
        io_a.write_budget = 100;
        assert_eq!(a.pump(&mut io_a, b).unwrap(), Progress::WantRead);
        assert_eq!(io_a.written, b"abcd");
        // The flow keeps its buffer and reads into it from then on.
        io_a.reads.push_back(b"ef".to_vec());
        assert_eq!(a.pump(&mut io_a, b).unwrap(), Progress::WantRead);
        assert_eq!(io_a.written, b"abcdef");
        drop(a);
        assert_eq!(gauge.held_bytes(), shared);
    }

    #[test]
    fn an_echo_the_socket_refuses_whole_is_kept_whole() {
        let b = &mut bufs(pingpong(1), Side::Server);
        let mut m = EchoServer::new(1);
        let mut io = Script::default();
        io.reads.push_back(b"x".to_vec());
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantWrite);
        io.write_budget = 1;
        assert_eq!(m.pump(&mut io, b).unwrap(), Progress::WantRead);
        assert_eq!(io.written, b"x");
        assert_eq!(
            m.moved,
            Moved {
                tx_bytes: 1,
                rx_bytes: 1
            }
        );
    }
}
