//! Opening a client's connections: non-blocking connects issued in a paced
//! window instead of one blocking connect after another, so a run measures
//! its flows, not the server's accept queue overflowing (SYNs dropped and
//! sent again after 1 s and 3 s, or connections reset when the server gave
//! up on a handshake the client thought done).
//!
//! - At most a window of connections of one client process are in setup at
//!   a time, never more than [`CONNECT_WINDOW`]. Each is done only once the
//!   server's role answered on it (the session proof, when the run has a
//!   token), so the window bounds what this client adds to the server's
//!   accept queue, not only its SYNs in flight: 16 client hosts of 256 fit
//!   the server's listen backlog of 4096.
//! - The window follows the server's backlog where that is smaller, as
//!   TCP's congestion window follows a path: it starts at
//!   [`INITIAL_WINDOW`] and grows by one per clean setup, at most doubling
//!   in a [`GROWTH_EPOCH`] (a loss cannot show sooner); a
//!   connection in setup seen retransmitting (TCP_INFO's
//!   `tcpi_total_retrans`, read every tick: a dropped SYN, or data after a
//!   handshake whose last ACK a full accept queue dropped) halves it, down
//!   to [`MIN_WINDOW`], and it then grows by one per window of clean
//!   setups. A burst past a small backlog does not stall: connections
//!   queued behind a full accept queue wait for their retransmissions,
//!   200 ms to seconds apart, and would miss the I/O timeout.
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
/// Connections in setup at first, before any has finished.
pub const INITIAL_WINDOW: usize = 8;
/// The narrowest the window gets after retransmissions.
pub const MIN_WINDOW: usize = 4;
/// The window at most doubles in this long: a loss shows as a
/// retransmission no sooner than TCP's shortest retransmission timeout
/// (200 ms), and until then the window must not run far past the
/// server's backlog.
pub const GROWTH_EPOCH: Duration = Duration::from_millis(200);
/// Longest wait in epoll before deadlines are checked.
const TICK: Duration = Duration::from_millis(50);

/// Which flows to open next: flows `0..total` in order, at most `window`
/// of them in setup at once. Like TCP's congestion window: it starts at
/// [`INITIAL_WINDOW`] and grows by one per clean setup (doubling with each
/// window's worth) up to its limit; a setup seen retransmitting halves it,
/// down to [`MIN_WINDOW`], and from then on it grows by one per window's
/// worth of clean setups until the next loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pacer {
    total: usize,
    window: usize,
    /// The widest the window gets.
    max_window: usize,
    /// Below this the window doubles per window of clean setups; at or
    /// above it, it grows by one.
    threshold: usize,
    /// Clean setups since the window last widened (above the threshold).
    clean: usize,
    next: usize,
    in_flight: usize,
    /// Setups seen retransmitting.
    lost: usize,
    /// When the current growth epoch began (`None`: at the first finish),
    /// and the window then: within an epoch the window at most doubles.
    epoch: Option<(Instant, usize)>,
}

impl Pacer {
    /// A pacer for `total` flows with at most `max_window` (at least 1) in
    /// setup at once.
    pub(crate) fn new(total: usize, max_window: usize) -> Pacer {
        let max_window = max_window.max(1);
        Pacer {
            total,
            window: INITIAL_WINDOW.min(max_window),
            max_window,
            threshold: max_window,
            clean: 0,
            next: 0,
            in_flight: 0,
            lost: 0,
            epoch: None,
        }
    }

    /// The window now.
    #[cfg(test)]
    pub(crate) fn window(&self) -> usize {
        self.window
    }

    /// Setups seen retransmitting so far.
    #[cfg(test)]
    pub(crate) fn lost(&self) -> usize {
        self.lost
    }

    /// The next flow to open, if the window has room and flows are left.
    pub(crate) fn next_to_open(&mut self) -> Option<usize> {
        if self.in_flight >= self.window || self.next >= self.total {
            return None;
        }
        let i = self.next;
        self.next += 1;
        self.in_flight += 1;
        Some(i)
    }

    /// A setup (in flight or just finished) was seen retransmitting at
    /// `now`: the server's queues overflowed, so the window halves. Call it
    /// once per setup.
    pub(crate) fn on_loss(&mut self, now: Instant) {
        self.lost += 1;
        self.clean = 0;
        self.threshold = (self.window / 2).max(MIN_WINDOW.min(self.max_window));
        self.window = self.threshold;
        self.epoch = Some((now, self.window));
    }

    /// A flow in setup finished it at `now`, `clean` if it never
    /// retransmitted: its place in the window is free, and a clean setup
    /// widens the window, by at most double in a [`GROWTH_EPOCH`].
    pub(crate) fn finished(&mut self, clean: bool, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if !clean {
            return;
        }
        let (start, base) = match self.epoch {
            Some((start, base)) if now.duration_since(start) < GROWTH_EPOCH => (start, base),
            _ => (now, self.window),
        };
        self.epoch = Some((start, base));
        let wider = if self.window < self.threshold {
            self.window + 1
        } else {
            self.clean += 1;
            if self.clean < self.window {
                return;
            }
            self.clean = 0;
            self.window + 1
        };
        self.window = wider.min(2 * base).min(self.max_window);
    }

    /// Flows in setup now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether every flow was opened and finished its setup.
    pub(crate) fn all_done(&self) -> bool {
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
    /// Whether its retransmission was already counted as a loss.
    lost: bool,
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
    let mut next_check = Instant::now() + TICK;
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
                    lost: false,
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
                    let clean = !p.lost && !retransmitted(&p.stream);
                    let now = Instant::now();
                    if !p.lost && !clean {
                        pacer.on_loss(now);
                    }
                    pacer.finished(clean, now);
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
        if now >= next_check {
            // Losses are seen as they happen, not only when the setups
            // they slow down finish.
            next_check = now + TICK;
            for p in pending.values_mut() {
                if !p.lost && retransmitted(&p.stream) {
                    p.lost = true;
                    pacer.on_loss(now);
                }
            }
        }
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

    /// A clock for the pacer that moves only when told.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Clock {
            Clock(Instant::now())
        }
        fn now(&self) -> Instant {
            self.0
        }
        /// Past the growth epoch, so the next finish may double again.
        fn next_epoch(&mut self) -> Instant {
            self.0 += GROWTH_EPOCH;
            self.0
        }
    }

    /// Finishes one flow in setup at `now` and opens what the window
    /// allows; the flows opened.
    fn step(p: &mut Pacer, clean: bool, now: Instant) -> Vec<usize> {
        if !clean {
            p.on_loss(now);
        }
        p.finished(clean, now);
        std::iter::from_fn(|| p.next_to_open()).collect()
    }

    #[test]
    fn the_window_bounds_flows_in_setup_and_every_flow_is_opened_once_in_order() {
        let mut clock = Clock::new();
        let mut p = Pacer::new(1000, 16);
        let mut opened: Vec<usize> = std::iter::from_fn(|| p.next_to_open()).collect();
        assert_eq!(opened, (0..INITIAL_WINDOW).collect::<Vec<_>>());
        let mut steps = 0;
        while !p.all_done() {
            opened.extend(step(&mut p, true, clock.next_epoch()));
            assert!(p.in_flight() <= 16);
            steps += 1;
            assert!(steps < 10_000, "stuck");
        }
        assert_eq!(opened, (0..1000).collect::<Vec<_>>());
        assert_eq!(p.window(), 16);
    }

    #[test]
    fn clean_setups_double_the_window_at_most_once_an_epoch_up_to_its_limit() {
        let mut clock = Clock::new();
        let mut p = Pacer::new(100_000, 256);
        std::iter::from_fn(|| p.next_to_open()).for_each(drop);
        // Within one epoch each clean setup frees its place and widens the
        // window by one, until it has doubled.
        let now = clock.now();
        for _ in 0..INITIAL_WINDOW {
            assert_eq!(step(&mut p, true, now).len(), 2);
        }
        assert_eq!(p.window(), 2 * INITIAL_WINDOW);
        for _ in 0..100 {
            step(&mut p, true, now);
        }
        assert_eq!(
            p.window(),
            2 * INITIAL_WINDOW,
            "more than doubled in one epoch"
        );
        // The next epoch may double it again.
        let now = clock.next_epoch();
        for _ in 0..100 {
            step(&mut p, true, now);
        }
        assert_eq!(p.window(), 4 * INITIAL_WINDOW);
        for _ in 0..1000 {
            step(&mut p, true, clock.next_epoch());
        }
        assert_eq!(p.window(), 256);
        assert_eq!(p.in_flight(), 256);
    }

    #[test]
    fn a_loss_halves_the_window_to_its_floor_and_growth_is_then_linear() {
        let mut clock = Clock::new();
        let mut p = Pacer::new(100_000, 64);
        for _ in 0..200 {
            step(&mut p, true, clock.next_epoch());
        }
        assert_eq!(p.window(), 64);
        p.on_loss(clock.now());
        assert_eq!(p.window(), 32);
        // Flows in setup past the narrowed window finish before more open.
        assert_eq!(p.next_to_open(), None);
        for _ in 0..10 {
            p.on_loss(clock.now());
        }
        assert_eq!(p.window(), MIN_WINDOW);
        assert_eq!(p.lost(), 11);
        // Past a loss a window's worth of clean setups widens it by one.
        let now = clock.next_epoch();
        for _ in 0..MIN_WINDOW {
            p.finished(true, now);
        }
        assert_eq!(p.window(), MIN_WINDOW + 1);
        // Never past its limit, however long it runs clean.
        for _ in 0..100_000 {
            step(&mut p, true, clock.next_epoch());
        }
        assert_eq!(p.window(), 64);
        // A finish after a loss counted in flight frees its place only.
        let w = p.window();
        p.finished(false, clock.now());
        assert_eq!(p.window(), w);
    }

    #[test]
    fn small_limits_are_kept_and_no_flows_is_done_at_once() {
        let now = Instant::now();
        let mut p = Pacer::new(2, 0);
        assert_eq!(p.next_to_open(), Some(0));
        assert_eq!(p.next_to_open(), None);
        p.on_loss(now);
        assert_eq!(p.window(), 1);
        p.finished(false, now);
        assert_eq!(p.next_to_open(), Some(1));
        p.finished(true, now);
        assert!(p.all_done());
        assert!(Pacer::new(0, 8).all_done());
        // A spurious finish never underflows.
        let mut p = Pacer::new(1, 1);
        p.finished(true, now);
        assert_eq!(p.in_flight(), 0);
        assert!(!p.all_done());
    }
}
