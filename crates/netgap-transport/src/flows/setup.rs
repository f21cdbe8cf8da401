//! Opening a client's connections: non-blocking connects issued in a paced
//! window instead of one blocking connect after another. At most
//! [`CONNECT_WINDOW`] connections of one client process are in setup at a
//! time; each is done only once the server's role answered on it (the
//! session proof, when the run has a token), so the window bounds what
//! this client adds to the server's accept queue, not only its SYNs in
//! flight. Completions are collected with epoll; each connection has the
//! I/O timeout to finish its setup. With several client hosts the server
//! sees at most their windows together: 16 hosts of 256 stay within the
//! server's listen backlog of 4096, so a run measures its flows, not the
//! accept queue overflowing (SYNs dropped, connections retried after 1 s and
//! 3 s, or reset when the server gave up on a handshake the client thought
//! done).

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
/// Longest wait in epoll before deadlines are checked.
const TICK: Duration = Duration::from_millis(50);

/// Which flows to open next: flows `0..total` in order, at most `window`
/// of them in setup at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pacer {
    total: usize,
    window: usize,
    next: usize,
    in_flight: usize,
}

impl Pacer {
    /// A pacer for `total` flows with `window` (at least 1) in setup at once.
    pub fn new(total: usize, window: usize) -> Pacer {
        Pacer {
            total,
            window: window.max(1),
            next: 0,
            in_flight: 0,
        }
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

    /// A flow in setup finished it: its place in the window is free.
    pub fn finished(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
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
                    done[i] = Some(p.stream);
                }
                pacer.finished();
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
        p.finished();
        assert_eq!(p.next_to_open(), Some(3));
        opened.push(3);
        assert_eq!(p.next_to_open(), None);
        let mut steps = 0;
        while !p.all_done() {
            p.finished();
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
        p.finished();
        assert_eq!(p.next_to_open(), Some(1));
        p.finished();
        assert!(p.all_done());
        assert!(Pacer::new(0, 8).all_done());
        // A spurious finish never underflows.
        let mut p = Pacer::new(1, 1);
        p.finished();
        assert_eq!(p.in_flight(), 0);
        assert!(!p.all_done());
    }
}
