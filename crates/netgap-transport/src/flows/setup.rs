//! Opening a client's connections: non-blocking connects issued in a paced
//! window instead of one blocking connect after another, so a run measures
//! its flows, not the server's accept queue overflowing (SYNs dropped and
//! sent again after 1 s and 3 s, or connections reset when the server gave
//! up on a handshake the client thought done).
//!
//! - At most a window of connections of one client process are in setup at
//!   a time, [`CONNECT_WINDOW`] at first. Each is done only once the
//!   server's role answered on it (the session proof, when the run has a
//!   token), so the window bounds what this client adds to the server's
//!   accept queue, not only its SYNs in flight: 16 client hosts of 256 fit
//!   the server's listen backlog of 4096.
//! - The window follows the server's backlog where that is smaller: a
//!   connection whose setup needed a retransmission (TCP_INFO's
//!   `tcpi_total_retrans`: a dropped SYN, or a handshake's last ACK dropped
//!   by a full accept queue) halves the window, down to [`MIN_WINDOW`]; a
//!   window's worth of clean setups widens it by one, up to where it began.
//! - Completions are collected with epoll; each connection has the I/O
//!   timeout to finish its setup.

use super::client::new_socket;
use super::machine::Progress;
use super::proof::ConnectorHandshake;
use super::{ClientSpec, EngineConfig, EngineError};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Most connections one client process has in setup at once.
pub const CONNECT_WINDOW: usize = 256;
/// The narrowest the window gets after retransmissions.
pub const MIN_WINDOW: usize = 4;
/// Longest wait in epoll before deadlines are checked.
const TICK: Duration = Duration::from_millis(50);

/// Which flows to open next: flows `0..total` in order, at most `window`
/// of them in setup at once, the window narrowed by setups that needed a
/// retransmission and widened again by clean ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pacer {
    total: usize,
    window: usize,
    /// The widest the window gets: where it began.
    max_window: usize,
    /// Clean setups since the window last widened.
    clean: usize,
    next: usize,
    in_flight: usize,
    /// Setups that needed a retransmission.
    retransmitted: usize,
}

impl Pacer {
    /// A pacer for `total` flows with `window` (at least 1) in setup at once.
    pub fn new(total: usize, window: usize) -> Pacer {
        let window = window.max(1);
        Pacer {
            total,
            window,
            max_window: window,
            clean: 0,
            next: 0,
            in_flight: 0,
            retransmitted: 0,
        }
    }

    /// The window now.
    #[cfg(test)]
    pub fn window(&self) -> usize {
        self.window
    }

    /// Setups so far that needed a retransmission.
    #[cfg(test)]
    pub fn retransmitted(&self) -> usize {
        self.retransmitted
    }

    /// The next flow to open, if the window has room and flows are left.
    pub fn next_to_open(&mut self) -> Option<usize> {
        if self.in_flight >= self.window || self.next >= self.total {
            return None;
        }
        let i = self.next;
        self.next += 1;
        self.in_flight += 1;
        Some(i)
    }

    /// A flow in setup finished it, `clean` if it needed no
    /// retransmission: its place in the window is free, and the window
    /// halves (a retransmission: the server's queues overflowed) or, after
    /// a window's worth of clean setups, widens by one.
    pub fn finished(&mut self, clean: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if clean {
            self.clean += 1;
            if self.clean >= self.window {
                self.clean = 0;
                self.window = (self.window + 1).min(self.max_window);
            }
        } else {
            self.retransmitted += 1;
            self.clean = 0;
            self.window = (self.window / 2).max(MIN_WINDOW.min(self.max_window));
        }
    }

    /// Flows in setup now.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether every flow was opened and finished its setup.
    pub fn all_done(&self) -> bool {
        self.next >= self.total && self.in_flight == 0
    }
}

/// One connection in setup.
struct Pending {
    stream: TcpStream,
    /// `None` until the TCP handshake is done (or with no token).
    proof: Option<ConnectorHandshake>,
    connected: bool,
    deadline: Instant,
    interest: EpollFlags,
}

/// Whether `stream` has retransmitted anything (a SYN, or the first data
/// after a handshake whose last ACK the server dropped); `false` when the
/// kernel does not say.
fn retransmitted(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain old data, for which all zeroes is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the lifetime of `stream`; `info`
    // and `len` are live and `len` gives the size of `info`, which the
    // kernel does not write past.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    r == 0 && info.tcpi_total_retrans > 0
}

/// Moves a connection's setup on after readiness; `true` once it is done.
fn advance(p: &mut Pending, cfg: &EngineConfig) -> io::Result<bool> {
    if !p.connected {
        if let Some(e) = p.stream.take_error()? {
            return Err(e);
        }
        p.connected = true;
        match &cfg.token {
            Some(token) => p.proof = Some(ConnectorHandshake::new(token)?),
            None => return Ok(true),
        }
    }
    let Some(proof) = p.proof.as_mut() else {
        return Ok(true);
    };
    match proof.pump(&mut &p.stream) {
        Ok(Progress::Done) => Ok(true),
        Ok(Progress::WantRead) => {
            p.interest = EpollFlags::EPOLLIN;
            Ok(false)
        }
        Ok(Progress::WantWrite) => {
            p.interest = EpollFlags::EPOLLOUT;
            Ok(false)
        }
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// A socket with its connect to the target started.
fn start(spec: &ClientSpec, cfg: &EngineConfig) -> io::Result<TcpStream> {
    let s = new_socket(spec.target, spec.bind_ip, cfg.path.name(), &cfg.options)?;
    s.set_nonblocking(true)?;
    match s.connect(&spec.target.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(s.into())
}

fn sys(what: &str, e: Errno) -> EngineError {
    EngineError::Sys {
        what: what.into(),
        source: e.into(),
    }
}

/// Opens every connection of `spec`, `window` in setup at once, each
/// connected and (with a token) proven within the I/O timeout; returns
/// them non-blocking, in flow order. The first failure ends the setup
/// naming its flow.
pub(crate) fn connect_all(
    spec: &ClientSpec,
    cfg: &EngineConfig,
    window: usize,
) -> Result<Vec<TcpStream>, EngineError> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
        .map_err(|e| sys("creating an epoll instance", e))?;
    let mut pacer = Pacer::new(spec.flows, window);
    let mut pending: HashMap<usize, Pending> = HashMap::with_capacity(pacer.window);
    let mut done: Vec<Option<TcpStream>> = Vec::with_capacity(spec.flows);
    done.resize_with(spec.flows, || None);
    let mut events = vec![EpollEvent::empty(); 256];
    let failed = |index: usize, source: io::Error| EngineError::Connect {
        index: index as u32,
        target: spec.target,
        source,
    };
    while !pacer.all_done() {
        while let Some(i) = pacer.next_to_open() {
            let stream = start(spec, cfg).map_err(|e| failed(i, e))?;
            epoll
                .add(&stream, EpollEvent::new(EpollFlags::EPOLLOUT, i as u64))
                .map_err(|e| sys("adding a connection to epoll", e))?;
            pending.insert(
                i,
                Pending {
                    stream,
                    proof: None,
                    connected: false,
                    deadline: Instant::now() + cfg.io_timeout,
                    interest: EpollFlags::EPOLLOUT,
                },
            );
        }
        let now = Instant::now();
        let wait = pending
            .values()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(TICK)
            .min(TICK);
        let wait_ms = u16::try_from(wait.as_millis() + 1).unwrap_or(u16::MAX);
        let n = match epoll.wait(&mut events, wait_ms) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            let i = ev.data() as usize;
            let Some(p) = pending.get_mut(&i) else {
                continue;
            };
            let before = p.interest;
            if advance(p, cfg).map_err(|e| failed(i, e))? {
                if let Some(p) = pending.remove(&i) {
                    let _ = epoll.delete(&p.stream);
                    pacer.finished(!retransmitted(&p.stream));
                    done[i] = Some(p.stream);
                }
            } else if p.interest != before {
                let mut ev = EpollEvent::new(p.interest, i as u64);
                epoll
                    .modify(&p.stream, &mut ev)
                    .map_err(|e| sys("changing a connection's epoll interest", e))?;
            }
        }
        let now = Instant::now();
        if let Some((&i, p)) = pending.iter().find(|(_, p)| p.deadline <= now) {
            let what = if p.connected {
                "connected, but the far end did not prove it belongs to this session within the I/O timeout; no payload was sent"
            } else {
                "not connected within the I/O timeout"
            };
            return Err(failed(
                i,
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what} ({:?})", cfg.io_timeout),
                ),
            ));
        }
    }
    let streams: Vec<TcpStream> = done.into_iter().flatten().collect();
    if streams.len() != spec.flows {
        return Err(EngineError::Invalid(format!(
            "{} of {} flows were opened",
            streams.len(),
            spec.flows
        )));
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_bounds_flows_in_setup_and_every_flow_is_opened_once_in_order() {
        let mut p = Pacer::new(10, 3);
        let mut opened = Vec::new();
        while let Some(i) = p.next_to_open() {
            opened.push(i);
        }
        assert_eq!(opened, vec![0, 1, 2]);
        assert_eq!(p.in_flight(), 3);
        // One finishes: one more opens, no more.
        p.finished(true);
        assert_eq!(p.next_to_open(), Some(3));
        opened.push(3);
        assert_eq!(p.next_to_open(), None);
        let mut steps = 0;
        while !p.all_done() {
            p.finished(true);
            while let Some(i) = p.next_to_open() {
                opened.push(i);
                assert!(p.in_flight() <= 3);
            }
            steps += 1;
            assert!(steps < 100, "stuck");
        }
        opened.sort_unstable();
        assert_eq!(opened, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn a_window_of_zero_still_opens_one_at_a_time_and_no_flows_is_done_at_once() {
        let mut p = Pacer::new(2, 0);
        assert_eq!(p.next_to_open(), Some(0));
        assert_eq!(p.next_to_open(), None);
        p.finished(false);
        assert_eq!(p.window(), 1);
        assert_eq!(p.next_to_open(), Some(1));
        p.finished(true);
        assert!(p.all_done());
        assert!(Pacer::new(0, 8).all_done());
        // A spurious finish never underflows.
        let mut p = Pacer::new(1, 1);
        p.finished(true);
        assert_eq!(p.in_flight(), 0);
        assert!(!p.all_done());
    }

    #[test]
    fn retransmissions_halve_the_window_to_its_floor_and_clean_setups_widen_it_back() {
        let mut p = Pacer::new(100_000, 64);
        for _ in 0..64 {
            p.next_to_open();
        }
        p.finished(false);
        assert_eq!(p.window(), 32);
        // Flows in setup past the narrowed window finish before more open.
        assert_eq!(p.next_to_open(), None);
        for _ in 0..10 {
            p.finished(false);
        }
        assert_eq!(p.window(), MIN_WINDOW);
        assert_eq!(p.retransmitted(), 11);
        // A window's worth of clean setups widens it by one.
        for _ in 0..MIN_WINDOW {
            p.finished(true);
        }
        assert_eq!(p.window(), MIN_WINDOW + 1);
        // Never past where it began, however long it runs clean.
        for _ in 0..100_000 {
            while p.next_to_open().is_some() {}
            p.finished(true);
        }
        assert_eq!(p.window(), 64);
        // A window that began under the floor keeps its size.
        let mut p = Pacer::new(10, 2);
        p.next_to_open();
        p.finished(false);
        assert_eq!(p.window(), 2);
    }
}
