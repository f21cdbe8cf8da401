//! netgap's closed-loop HTTP/1.1 load generator: each client (flow) sends
//! one GET, reads the whole response, checks it, and sends the next, on a
//! kept-alive connection or on a new connection per request. A few worker
//! threads each own a fixed share of the clients and one epoll instance
//! (level-triggered, each connection's interest exactly what its state
//! waits for), as the flow engine's workers do; no async runtime is on the
//! measured path. Responses are parsed with `httparse`; every status and
//! length is checked, and a stated fraction of bodies is compared byte for
//! byte with the content the file set regenerates.

use super::fileset::{mix64, FileSet, Zipf};
use netgap_core::stats::FlowHistogram;
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a worker's receive buffer, which every connection of the
/// worker reads into in turn; also the largest response head accepted.
pub(crate) const BUF_BYTES: usize = 64 * 1024;
/// Most response headers parsed.
const MAX_HEADERS: usize = 32;
/// An upper bound of a connection's own state (`Conn`, without what it
/// points to), bytes; a unit test holds it to that.
#[cfg(test)]
const CONN_STATE_BYTES: u64 = 512;

/// What the clients of one role do.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    /// The server's `IP:PORT`.
    pub target: SocketAddr,
    /// Local address each connection leaves from, if chosen.
    pub bind_ip: Option<IpAddr>,
    /// Clients of this role.
    pub flows: usize,
    /// Worker threads (each with its own epoll).
    pub workers: usize,
    /// One connection per client for all its requests; otherwise a new
    /// connection per request (`Connection: close`).
    pub keepalive: bool,
    /// The files served.
    pub fileset: Arc<FileSet>,
    /// Popularity over the files; `None` asks for file 0 only.
    pub zipf: Option<Arc<Zipf>>,
    /// Share of bodies compared with their content, 0 to 1.
    pub verify_fraction: f64,
    /// Seeds each client's request sequence (with its index).
    pub seed: u64,
    /// How long a connection may make no progress before it is an error.
    pub io_timeout: Duration,
    /// Spin on epoll instead of sleeping in it.
    pub poll: bool,
    /// Where each worker's receive buffer starts (`--align`, `--offset`;
    /// a page by default).
    pub buffer: BufferLayout,
}

/// One client's results.
#[derive(Debug, Clone)]
pub(crate) struct ClientOutcome {
    /// The client's index in the role.
    pub index: u32,
    /// Transactions (a request and its full, checked response) completed
    /// inside the window.
    pub transactions: u64,
    /// Body bytes of those transactions.
    pub window_body_bytes: u64,
    /// Bytes written over the whole run.
    pub bytes_tx: u64,
    /// Bytes read over the whole run.
    pub bytes_rx: u64,
    /// Responses that failed a check, connections refused, reset or stalled,
    /// in the warm-up and the window: any failure marks the point.
    pub errors: u64,
    /// Responses complete and checked (status, length, every body byte
    /// received) among the window's transactions.
    pub checked: u64,
    /// Bodies compared byte for byte among the window's transactions.
    pub verified: u64,
    /// Connections opened, whole run.
    pub connections: u64,
    /// The latency of each transaction in the window, ns.
    pub hist: FlowHistogram,
    /// The last error seen.
    pub last_error: Option<String>,
}

/// Why the clients could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A system call the workers need failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A worker thread panicked; a bug.
    #[error("an HTTP client worker panicked")]
    Panicked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No connection; the next request opens one.
    Closed,
    /// A non-blocking connect under way.
    Connecting,
    /// Writing the request.
    Sending,
    /// Reading the status line and headers.
    Head,
    /// Reading the body.
    Body,
    /// After a `Connection: close` response: waiting for the server's close.
    Draining,
}

struct Conn {
    /// The connection's place in its worker's list: its epoll key.
    slot: u64,
    sock: Option<Socket>,
    phase: Phase,
    req: Vec<u8>,
    /// The file `req` asks for: a client of the single-file trace formats
    /// its request once.
    req_file: Option<usize>,
    sent: usize,
    /// A response head split across reads, kept until it is complete;
    /// empty (no allocation) otherwise, which is nearly always: a head
    /// usually arrives whole in one read of the worker's buffer.
    head: Vec<u8>,
    /// Bytes of this response read so far (its head and body).
    got: u64,
    file: usize,
    body_left: u64,
    body_off: u64,
    verify: bool,
    started: Instant,
    last_progress: Instant,
    rng: u64,
    /// Requests begun, for the verify sampling.
    begun: u64,
    interest: EpollFlags,
    out: ClientOutcome,
}

/// Why one transaction failed.
type Failure = String;

struct Worker<'a> {
    cfg: &'a ClientConfig,
    epoll: Epoll,
    /// The `Host` header's value.
    host: String,
    /// When the measured window starts and ends.
    window: (Instant, Instant),
}

impl Conn {
    fn new(index: u32, slot: u64, seed: u64) -> Conn {
        let now = Instant::now();
        Conn {
            slot,
            sock: None,
            phase: Phase::Closed,
            req: Vec::with_capacity(128),
            req_file: None,
            sent: 0,
            head: Vec::new(),
            got: 0,
            file: 0,
            body_left: 0,
            body_off: 0,
            verify: false,
            started: now,
            last_progress: now,
            rng: mix64(seed ^ u64::from(index)),
            begun: 0,
            interest: EpollFlags::empty(),
            out: ClientOutcome {
                index,
                transactions: 0,
                window_body_bytes: 0,
                bytes_tx: 0,
                bytes_rx: 0,
                errors: 0,
                checked: 0,
                verified: 0,
                connections: 0,
                hist: FlowHistogram::new(),
                last_error: None,
            },
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.rng)
    }
}

impl Worker<'_> {
    fn set_interest(&self, c: &mut Conn, want: EpollFlags) -> Result<(), Failure> {
        let Some(sock) = c.sock.as_ref() else {
            return Ok(());
        };
        if c.interest == want {
            return Ok(());
        }
        let mut ev = EpollEvent::new(want, c.slot);
        let r = if c.interest.is_empty() {
            self.epoll.add(sock.as_fd(), ev)
        } else {
            self.epoll.modify(sock.as_fd(), &mut ev)
        };
        r.map_err(|e| format!("epoll: {e}"))?;
        c.interest = want;
        Ok(())
    }

    fn close(&self, c: &mut Conn) {
        if let Some(s) = c.sock.take() {
            if !c.interest.is_empty() {
                let _ = self.epoll.delete(s.as_fd());
            }
        }
        c.interest = EpollFlags::empty();
        c.phase = Phase::Closed;
    }

    /// Begins the next request of `c`: picks its file and sends it, on
    /// the open connection or a new one.
    fn begin(&self, c: &mut Conn, buf: &mut [u8]) -> Result<(), Failure> {
        c.file = match &self.cfg.zipf {
            Some(z) => {
                let u = (c.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                z.pick(u)
            }
            None => 0,
        };
        let f = self.cfg.verify_fraction;
        c.verify = ((c.begun + 1) as f64 * f).floor() > (c.begun as f64 * f).floor();
        c.begun += 1;
        if c.req_file != Some(c.file) {
            c.req.clear();
            let _ = write!(
                c.req,
                "GET {} HTTP/1.1\r\nHost: {}\r\n{}\r\n",
                FileSet::url(c.file),
                self.host,
                if self.cfg.keepalive {
                    ""
                } else {
                    "Connection: close\r\n"
                }
            );
            c.req_file = Some(c.file);
        }
        c.sent = 0;
        c.got = 0;
        c.head = Vec::new();
        c.started = Instant::now();
        c.last_progress = c.started;
        if c.sock.is_none() {
            let domain = Domain::for_address(self.cfg.target);
            let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| format!("socket: {e}"))?;
            s.set_nonblocking(true)
                .map_err(|e| format!("O_NONBLOCK: {e}"))?;
            s.set_nodelay(true)
                .map_err(|e| format!("TCP_NODELAY: {e}"))?;
            if let Some(ip) = self.cfg.bind_ip {
                s.bind(&SockAddr::from(SocketAddr::new(ip, 0)))
                    .map_err(|e| format!("binding {ip}: {e}"))?;
            }
            c.out.connections += 1;
            match s.connect(&SockAddr::from(self.cfg.target)) {
                Ok(()) => c.phase = Phase::Sending,
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                    c.phase = Phase::Connecting;
                }
                Err(e) => return Err(format!("connecting to {}: {e}", self.cfg.target)),
            }
            c.sock = Some(s);
            if c.phase == Phase::Connecting {
                return self.set_interest(c, EpollFlags::EPOLLOUT);
            }
        } else {
            c.phase = Phase::Sending;
        }
        self.pump(c, buf)
    }

    /// Moves `c` as far as its socket allows, reading into the worker's
    /// buffer `buf`.
    fn pump(&self, c: &mut Conn, buf: &mut [u8]) -> Result<(), Failure> {
        loop {
            let Some(sock) = c.sock.as_ref() else {
                return Ok(());
            };
            match c.phase {
                Phase::Closed => return Ok(()),
                Phase::Connecting => {
                    match sock.take_error() {
                        Ok(None) => {}
                        Ok(Some(e)) | Err(e) => {
                            return Err(format!("connecting to {}: {e}", self.cfg.target))
                        }
                    }
                    c.phase = Phase::Sending;
                }
                Phase::Sending => {
                    let mut s: &Socket = sock;
                    match s.write(&c.req[c.sent..]) {
                        Ok(n) => {
                            c.sent += n;
                            c.out.bytes_tx += n as u64;
                            c.last_progress = Instant::now();
                            if c.sent == c.req.len() {
                                c.phase = Phase::Head;
                                // The response cannot be in yet; epoll says
                                // when it is.
                                return self.set_interest(c, EpollFlags::EPOLLIN);
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            return self.set_interest(c, EpollFlags::EPOLLOUT)
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(format!("sending a request: {e}")),
                    }
                }
                Phase::Head | Phase::Body | Phase::Draining => {
                    let mut s: &Socket = sock;
                    // A split head is kept whole in `c.head`: read no more
                    // than the head limit leaves.
                    let room = if c.phase == Phase::Head {
                        BUF_BYTES.saturating_sub(c.head.len()).min(buf.len())
                    } else {
                        buf.len()
                    };
                    let n = match s.read(&mut buf[..room]) {
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            return self.set_interest(c, EpollFlags::EPOLLIN)
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => return Err(format!("reading a response: {e}")),
                    };
                    c.out.bytes_rx += n as u64;
                    c.last_progress = Instant::now();
                    if c.phase == Phase::Draining {
                        if n != 0 {
                            return Err("bytes after a Connection: close response".into());
                        }
                        self.close(c);
                        return Ok(());
                    }
                    if n == 0 {
                        return Err(format!(
                            "the server closed the connection {} the response",
                            if c.phase == Phase::Head && c.got == 0 {
                                "before"
                            } else {
                                "in the middle of"
                            }
                        ));
                    }
                    c.got += n as u64;
                    if c.phase == Phase::Head {
                        self.head(c, &buf[..n])?;
                    } else {
                        self.body(c, &buf[..n])?;
                    }
                    if c.phase == Phase::Body && c.body_left == 0 {
                        self.finish(c, buf)?;
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Takes `read`, the bytes of a read while the response head is
    /// incomplete: parses the head (from `read` itself when no earlier part
    /// is kept, else from the kept part with `read` appended); once
    /// complete, checks it and takes the body bytes that came with it, and
    /// otherwise keeps what came so far.
    fn head(&self, c: &mut Conn, read: &[u8]) -> Result<(), Failure> {
        let kept = std::mem::take(&mut c.head);
        let joined;
        let bytes: &[u8] = if kept.is_empty() {
            read
        } else {
            joined = [kept.as_slice(), read].concat();
            &joined
        };
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if bytes.len() >= BUF_BYTES {
                    return Err(format!("a response head over {BUF_BYTES} bytes"));
                }
                c.head = bytes.to_vec();
                return Ok(());
            }
            Err(e) => return Err(format!("a malformed response: {e}")),
        };
        if resp.code != Some(200) {
            return Err(format!(
                "status {} for {}",
                resp.code.unwrap_or(0),
                FileSet::url(c.file)
            ));
        }
        let mut length: Option<u64> = None;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                length = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok());
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err("a chunked response where a length was expected".into());
            }
        }
        let want = self.cfg.fileset.size_bytes(c.file);
        if length != Some(want) {
            return Err(format!(
                "Content-Length {length:?} for {} of {want} bytes",
                FileSet::url(c.file)
            ));
        }
        c.phase = Phase::Body;
        c.body_left = want;
        c.body_off = 0;
        self.body(c, &bytes[n..])
    }

    /// Takes body bytes `data` (straight from the worker's buffer),
    /// comparing them when this response is verified.
    fn body(&self, c: &mut Conn, data: &[u8]) -> Result<(), Failure> {
        let n = data.len() as u64;
        if n > c.body_left {
            return Err("more bytes than the response's length".into());
        }
        if c.verify && !self.cfg.fileset.matches(c.file, c.body_off, data) {
            return Err(format!(
                "the body of {} differs from the file set's content near byte {}",
                FileSet::url(c.file),
                c.body_off
            ));
        }
        c.body_off += n;
        c.body_left -= n;
        Ok(())
    }

    /// Ends a transaction whose response is complete, counts it if it ends
    /// in the window, and begins the next.
    fn finish(&self, c: &mut Conn, buf: &mut [u8]) -> Result<(), Failure> {
        let now = Instant::now();
        let window = self.window;
        if now >= window.0 && now < window.1 {
            c.out.checked += 1;
            if c.verify {
                c.out.verified += 1;
            }
            c.out.transactions += 1;
            c.out.window_body_bytes += self.cfg.fileset.size_bytes(c.file);
            let ns = u64::try_from((now - c.started).as_nanos()).unwrap_or(u64::MAX);
            c.out.hist.record_ns(ns);
        }
        if self.cfg.keepalive {
            c.phase = Phase::Sending;
            if now < window.1 {
                return self.begin(c, buf);
            }
            return Ok(());
        }
        c.phase = Phase::Draining;
        self.set_interest(c, EpollFlags::EPOLLIN)
    }

    fn fail(&self, c: &mut Conn, why: Failure) {
        c.out.errors += 1;
        c.out.last_error = Some(why);
        self.close(c);
    }
}

/// Runs `cfg.flows` clients for `warmup` and then `duration` (or until
/// `stop`): every client keeps one request outstanding; transactions that
/// complete in the window are counted. Returns each client's outcome (in
/// index order) and the window's length as timed, ns.
pub(crate) fn run(
    cfg: &ClientConfig,
    warmup: Duration,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<(Vec<ClientOutcome>, u64), ClientError> {
    let t0 = Instant::now();
    let window = (t0 + warmup, t0 + warmup + duration);
    let workers = cfg.workers.clamp(1, cfg.flows.max(1));
    let host = cfg.target.to_string();
    let results: Vec<Result<Vec<ClientOutcome>, ClientError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let host = host.clone();
                std::thread::Builder::new()
                    .name(format!("http client {w}"))
                    .spawn_scoped(scope, move || {
                        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| {
                            ClientError::Sys {
                                what: "creating an epoll instance",
                                source: e.into(),
                            }
                        })?;
                        let worker = Worker {
                            cfg,
                            epoll,
                            host,
                            window,
                        };
                        let indices: Vec<usize> = (w..cfg.flows).step_by(workers).collect();
                        Ok(worker.run(&indices, stop))
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or(Err(ClientError::Panicked)),
                Err(source) => Err(ClientError::Sys {
                    what: "starting an HTTP client worker",
                    source,
                }),
            })
            .collect()
    });
    let end = Instant::now().min(window.1);
    let elapsed_ns =
        u64::try_from(end.saturating_duration_since(window.0).as_nanos()).unwrap_or(u64::MAX);
    let mut all = Vec::with_capacity(cfg.flows);
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|o| o.index);
    Ok((all, elapsed_ns))
}

/// How often a worker looks for stalled connections and restarts failed
/// ones.
const TICK: Duration = Duration::from_millis(10);

impl Worker<'_> {
    fn run(&self, indices: &[usize], stop: &AtomicBool) -> Vec<ClientOutcome> {
        // The one receive buffer of this worker's connections: each reads
        // into it in turn and keeps only what must outlive the read.
        let mut buf = AlignedBuffer::zeroed(BUF_BYTES, self.cfg.buffer);
        let mut conns: Vec<Conn> = indices
            .iter()
            .enumerate()
            .map(|(slot, &i)| Conn::new(i as u32, slot as u64, self.cfg.seed))
            .collect();
        for c in conns.iter_mut() {
            if let Err(e) = self.begin(c, &mut buf) {
                self.fail(c, e);
            }
        }
        let mut events = vec![EpollEvent::empty(); conns.len().clamp(1, 1024)];
        let wait_ms: u16 = if self.cfg.poll { 0 } else { 10 };
        let mut next_tick = Instant::now() + TICK;
        loop {
            let now = Instant::now();
            if now >= self.window.1 || stop.load(Ordering::Relaxed) {
                break;
            }
            let n = match self.epoll.wait(&mut events, wait_ms) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            };
            for ev in &events[..n] {
                let Some(c) = usize::try_from(ev.data())
                    .ok()
                    .and_then(|k| conns.get_mut(k))
                else {
                    continue;
                };
                match self.pump(c, &mut buf) {
                    Ok(()) if c.phase == Phase::Closed && Instant::now() < self.window.1 => {
                        if let Err(e) = self.begin(c, &mut buf) {
                            self.fail(c, e);
                        }
                    }
                    Ok(()) => {}
                    Err(e) => self.fail(c, e),
                }
            }
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + TICK;
                for c in conns.iter_mut() {
                    if c.phase == Phase::Closed {
                        if let Err(e) = self.begin(c, &mut buf) {
                            self.fail(c, e);
                        }
                    } else if now.duration_since(c.last_progress) > self.cfg.io_timeout {
                        let why = format!(
                            "no progress for {:?} on a request to {}",
                            self.cfg.io_timeout, self.cfg.target
                        );
                        self.fail(c, why);
                    }
                }
            }
        }
        for c in conns.iter_mut() {
            self.close(c);
        }
        conns.into_iter().map(|c| c.out).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holds_no_receive_buffer() {
        // The state a client keeps between reads; its receive buffer is
        // its worker's.
        let size = std::mem::size_of::<Conn>();
        eprintln!("Conn: {size} bytes");
        assert!(size <= CONN_STATE_BYTES as usize, "{size}");
        let c = Conn::new(7, 0, 1);
        assert_eq!(c.head.capacity(), 0);
    }

    /// A server that sends each response a few bytes at a time, so every
    /// head is split across many reads: the clients keep the parts and
    /// check every response whole.
    #[test]
    fn a_head_split_across_reads_is_kept_and_every_response_checked() {
        use std::net::TcpListener;
        let set = Arc::new(FileSet::single(3, 700));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = listener.local_addr().expect("addr");
        let served = Arc::clone(&set);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.set_nodelay(true).expect("nodelay");
            let mut body = vec![0u8; 700];
            served.fill(0, 0, &mut body);
            let mut resp =
                b"HTTP/1.1 200 OK\r\nServer: split\r\nContent-Length: 700\r\n\r\n".to_vec();
            resp.extend_from_slice(&body);
            let mut req = Vec::new();
            let mut b = [0u8; 512];
            loop {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&b[..n]),
                }
                while let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                    req.drain(..end + 4);
                    // The head in 7-byte pieces, each its own read at the
                    // client, then the body at once: few enough pauses
                    // that a loaded machine still fits several responses
                    // in the window.
                    let (head, body) = resp.split_at(resp.len() - 700);
                    for chunk in head.chunks(7) {
                        if s.write_all(chunk).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    if s.write_all(body).is_err() {
                        return;
                    }
                }
            }
        });
        let cfg = ClientConfig {
            target,
            bind_ip: None,
            flows: 1,
            workers: 1,
            keepalive: true,
            fileset: set,
            zipf: None,
            verify_fraction: 1.0,
            seed: 1,
            io_timeout: Duration::from_secs(5),
            poll: false,
            buffer: BufferLayout::default(),
        };
        let stop = AtomicBool::new(false);
        // A warm-up of a few responses, which the window's counts leave out.
        let (outs, _) = run(
            &cfg,
            Duration::from_millis(150),
            Duration::from_millis(300),
            &stop,
        )
        .expect("run");
        server.join().expect("the test server");
        let first = &outs[0];
        assert_eq!(first.errors, 0, "{:?}", first.last_error);
        assert!(first.checked >= 2, "{first:?}");
        assert_eq!(first.checked, first.transactions, "{first:?}");
        assert_eq!(first.verified, first.checked);
    }
}
