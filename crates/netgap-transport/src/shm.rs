//! Shared memory (`shm`): the same host only, and the fastest path two
//! processes have, so it is the floor against which every other transport's
//! gap is read. Like every [`Transport`], it carries the tests unchanged; it
//! moves bytes through memory instead of the kernel.
//!
//! One flow is one sealed memfd mapped `MAP_SHARED` by both ends (see
//! [`region`]) holding one single-producer, single-consumer byte ring per
//! direction: netgap's one shared-memory channel (`netgap_shm`, whose docs
//! give the layout, the index discipline and the wake rule, which the
//! preload library and the relay share). Sending copies the caller's bytes
//! into the ring and publishes the new producer index; receiving copies
//! bytes out and publishes the new consumer index. A message larger than
//! the ring streams through it: `send_some` takes what fits, `recv_some`
//! returns what is there, so the flow is a reliable byte stream without
//! message boundaries, like a stream socket.
//!
//! Rendezvous follows [`super::unix`]: the listener is a Unix stream socket
//! file in the temporary directory (its path is the address), removed once
//! the peer is accepted. The listener creates the memfd up front and passes
//! it over the accepted socket (SCM_RIGHTS); the connector checks it before
//! use. That socket then stays open for the life of the flow as its liveness
//! signal: when a wait makes no progress, the socket is checked for hang-up
//! without blocking, so a peer that exits or drops its flow is seen as
//! [`FlowError::Closed`] instead of a wait that never ends.
//!
//! Waiting follows the flow's [`Mode`], which the region's header records
//! as its wait rule. Poll mode makes no system call while data moves: it
//! spins on the peer's index, reading the clock every
//! [`SPINS_PER_CLOCK_READ`] spins and checking liveness every
//! [`LIVENESS_PERIOD`] without progress; its region is made for ends that
//! never sleep, so a side that moved its index looks at no waiter word.
//! Event mode sleeps on its ring's waiter word by the channel's wake rule
//! (`WAIT_FUTEX`), in slices of at most [`SLEEP_SLICE`]; the other side
//! makes `FUTEX_WAKE` only when the word says someone sleeps, so two busy
//! sides make no system calls either. Event mode does not spin before
//! sleeping: it is meant to show what blocking costs, and poll mode already
//! shows spinning.

pub mod region;
mod sys;

use super::{
    Capabilities, Flow, FlowConfig, FlowError, Listener, Receiver, Sender, Transport,
    TransportError, Unavailable,
};
use netgap_core::spec::Mode;
use netgap_shm::wait::{self, WAIT_FUTEX};
use netgap_shm::{Consumer, OwnIndex, Producer, Region, RingError, RingId, Role};
use std::io;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NAME: &str = "shm";

/// Bytes of each ring's data region (one ring per direction; the memfd
/// holds both plus three 4 KiB pages).
///
/// 4 MiB lets a sender run a whole 1 MiB message (and then some) ahead of
/// the receiver, so the two copies — into the ring on one core, out of it on
/// the other — overlap instead of taking turns; smaller rings made the
/// sender wait for space at every message. Larger rings buy nothing: the
/// data must cross between the cores' caches either way, and the shared
/// last-level cache (32 MiB here) still holds both rings and both sides'
/// buffers.
pub(crate) const RING_CAPACITY_BYTES: usize = 4 << 20;

/// Most bytes a single `send_some` or `recv_some` copies (256 KiB). Large
/// messages are published in pieces of this size, so the receiver starts
/// copying a piece while the sender writes the next one and reads it while
/// it is still in a cache, instead of waiting for a whole multi-megabyte
/// copy; each piece costs one index update (a cache-line transfer, well
/// under a microsecond) against ~15 µs of copying.
pub(crate) const MAX_COPY_BYTES: usize = 256 << 10;

/// Poll mode: spins between two clock reads while nothing moves. A clock
/// read costs tens of nanoseconds; a spin (PAUSE plus one index load) about
/// as much, so the clock costs a few per cent of a wait's polling rate.
pub const SPINS_PER_CLOCK_READ: u32 = 128;

/// How long a wait runs without progress between two checks of the peer's
/// liveness socket (a non-blocking `poll`). In poll mode each check also
/// yields the CPU once, so a spinning thread on an oversubscribed machine
/// lets the thread it waits for run.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(1);

/// Event mode: the longest single futex sleep. Liveness and the inactivity
/// timeout are checked between sleeps, so a peer that dies without waking
/// us is noticed within this long.
pub const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// Sent with the memfd; also tells a connector that it reached an `shm`
/// listener and not some other socket.
const HELLO: &[u8; 8] = b"NGSHM-v1";

/// Shared memory between two processes on one host.
pub(crate) struct Shm;

fn listen_err(source: io::Error) -> TransportError {
    TransportError::Listen {
        transport: NAME,
        source,
    }
}

fn corrupt(e: RingError) -> FlowError {
    FlowError::Io(io::Error::new(io::ErrorKind::InvalidData, e))
}

/// What both halves of a flow share: the mapping (the rings' memory) and
/// the liveness socket. Dropped when the last half goes, which shuts the
/// socket down (the peer's next liveness check sees it) and wakes any
/// futex sleeper of the peer so it checks at once.
struct Shared {
    region: Region,
    socket: UnixStream,
    mode: Mode,
    timeout: Duration,
    /// Set by the flow's [`AbortHandle`]: calls fail from then on. Looked
    /// at in every wait and every [`CALLS_PER_ABORT_CHECK`] calls of a
    /// half, because a flow whose data keeps moving never waits, and so
    /// never looks at the liveness socket.
    aborted: AtomicBool,
}

impl Shared {
    /// Fails once the flow was ended by its [`AbortHandle`].
    #[inline]
    fn check_aborted(&self) -> Result<(), FlowError> {
        if self.aborted.load(Ordering::Relaxed) {
            return Err(super::aborted());
        }
        Ok(())
    }

    /// Ends the flow from another thread: raises the abort flag, shuts the
    /// liveness socket down (the peer's next check sees the hang-up) and
    /// wakes every sleeper.
    fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        let _ = self.socket.shutdown(Shutdown::Both);
        self.wake_all();
    }

    /// Wakes every futex sleeper on both rings, of either side, so each
    /// looks at the flow's state at once.
    fn wake_all(&self) {
        for id in [RingId::ToConnector, RingId::ToListener] {
            let ctl = self.region.ctl(id);
            // Words of the live region: a wake cannot fail.
            let _ = wait::futex_wake(&ctl.data_waiter.0);
            let _ = wait::futex_wake(&ctl.space_waiter.0);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(Shutdown::Both);
        self.wake_all();
    }
}

/// The sending half of an `shm` flow: the producer of the outgoing ring.
pub(crate) struct ShmSender {
    ring: Producer,
    shared: Arc<Shared>,
    abort_check: AbortCountdown,
}

/// The receiving half of an `shm` flow: the consumer of the incoming ring.
pub(crate) struct ShmReceiver {
    ring: Consumer,
    shared: Arc<Shared>,
    abort_check: AbortCountdown,
}

/// Calls of one half between two looks at the abort flag while its data
/// keeps moving (a wait looks at it every [`SPINS_PER_CLOCK_READ`] spins
/// anyway). A look on every call put a load of the flag's line and a branch
/// on the path of every message, and the shm ping-pong, a few tens of
/// nanoseconds a message, went from at most the C floor to 1.4-1.6 times it;
/// a counter in the half's own memory costs a decrement. An abort still
/// ends a flow whose data never waits within this many calls, well under a
/// millisecond.
pub const CALLS_PER_ABORT_CHECK: u32 = 64;

/// Counts a half's calls down to its next look at the abort flag.
struct AbortCountdown(u32);

impl AbortCountdown {
    fn new() -> AbortCountdown {
        AbortCountdown(CALLS_PER_ABORT_CHECK)
    }

    /// Fails once the flow was aborted, looking at the flag only every
    /// [`CALLS_PER_ABORT_CHECK`] calls.
    #[inline(always)]
    fn tick(&mut self, shared: &Shared) -> Result<(), FlowError> {
        self.0 -= 1;
        if self.0 == 0 {
            self.0 = CALLS_PER_ABORT_CHECK;
            shared.check_aborted()?;
        }
        Ok(())
    }
}

/// An `shm` flow: a sender and a receiver sharing one mapping.
pub(crate) struct ShmFlow {
    tx: ShmSender,
    rx: ShmReceiver,
}

impl ShmFlow {
    /// The flow of `role`'s end of `region` (checked when it was made or
    /// opened).
    fn new(region: Region, socket: UnixStream, role: Role, config: &FlowConfig) -> ShmFlow {
        // No flow outlives a fork in the process that made it: each end
        // keeps its own index privately (no load of a line the peer spins
        // on).
        let (tx, rx) = region.ends_with(role, OwnIndex::Private);
        let shared = Arc::new(Shared {
            region,
            socket,
            mode: config.mode,
            timeout: config.io_timeout,
            aborted: AtomicBool::new(false),
        });
        ShmFlow {
            tx: ShmSender {
                ring: tx,
                shared: Arc::clone(&shared),
                abort_check: AbortCountdown::new(),
            },
            rx: ShmReceiver {
                ring: rx,
                shared,
                abort_check: AbortCountdown::new(),
            },
        }
    }
}

/// One try at moving bytes.
enum Attempt {
    /// This many bytes (at least 1) moved.
    Moved(usize),
    /// Nothing could move; the peer's index holds `expected` until the
    /// peer makes room or data.
    Blocked {
        /// The peer's index as last read.
        expected: u64,
    },
}

/// The bookkeeping of one wait that has not made progress yet: when it
/// started (for the inactivity timeout) and when to look at the peer next.
/// The clock is first read only once a wait has spun for a while, so a wait
/// that ends quickly never reads it.
#[derive(Default)]
struct Stall {
    start: Option<Instant>,
    next_liveness: Option<Instant>,
}

impl Stall {
    /// Time left before the inactivity timeout, starting the clock if needed.
    fn left(&mut self, now: Instant, timeout: Duration) -> Duration {
        let start = *self.start.get_or_insert(now);
        timeout.saturating_sub(now.duration_since(start))
    }

    /// Fails with `TimedOut` once the wait has lasted the inactivity timeout
    /// and with `Closed` once the peer hung up. The peer is checked every
    /// [`LIVENESS_PERIOD`] in poll mode and on every call in event mode
    /// (called once per futex sleep, which costs far more than the check).
    fn check(&mut self, shared: &Shared) -> Result<(), FlowError> {
        shared.check_aborted()?;
        let now = Instant::now();
        if self.left(now, shared.timeout).is_zero() {
            return Err(FlowError::TimedOut {
                timeout_ms: shared.timeout.as_millis(),
            });
        }
        let due = match shared.mode {
            Mode::Event => true,
            Mode::Poll => *self.next_liveness.get_or_insert(now + LIVENESS_PERIOD) <= now,
        };
        if !due {
            return Ok(());
        }
        self.next_liveness = Some(now + LIVENESS_PERIOD);
        if sys::peer_hung_up(&shared.socket).map_err(FlowError::Io)? {
            return Err(FlowError::Closed);
        }
        if shared.mode == Mode::Poll {
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Waits until `attempt` moves bytes, per the flow's mode. `waiter` is this
/// side's waiter word (event mode sleeps on it), `index` the peer's index
/// that `attempt`'s `expected` refers to (poll mode watches it), and `seen`
/// its value when the caller's own attempt found nothing to move.
fn wait_for(
    shared: &Shared,
    waiter: &AtomicU32,
    index: &AtomicU64,
    mut seen: u64,
    mut attempt: impl FnMut() -> Result<Attempt, FlowError>,
) -> Result<usize, FlowError> {
    let mut stall = Stall::default();
    let failed = loop {
        match shared.mode {
            Mode::Poll => {
                // Only the peer's index is watched, as the C floor watches
                // its flag; the whole attempt (bounds checks, copy, its
                // result) runs once the index has moved.
                for _ in 0..SPINS_PER_CLOCK_READ {
                    if index.load(Ordering::Relaxed) != seen {
                        match attempt()? {
                            Attempt::Moved(n) => return Ok(n),
                            Attempt::Blocked { expected } => seen = expected,
                        }
                    }
                    std::hint::spin_loop();
                }
            }
            Mode::Event => {
                // Announce the sleep, then look once more: by the wake
                // rule either this attempt sees the peer's update or the
                // peer sees the bit and wakes us (and if the wake comes
                // before we sleep, it cleared the word, so FUTEX_WAIT sees
                // the word changed and returns at once).
                let armed = wait::arm(waiter, WAIT_FUTEX);
                let first = attempt();
                if !matches!(first, Ok(Attempt::Blocked { .. })) {
                    wait::disarm(waiter, WAIT_FUTEX);
                }
                if let Attempt::Moved(n) = first? {
                    return Ok(n);
                }
                let left = stall.left(Instant::now(), shared.timeout);
                let slept = wait::futex_wait(waiter, armed, left.min(SLEEP_SLICE));
                // A sleep that ran out (or a signal): the peer need not
                // wake this side on its next move.
                wait::disarm(waiter, WAIT_FUTEX);
                slept.map_err(FlowError::Io)?;
                if let Attempt::Moved(n) = attempt()? {
                    return Ok(n);
                }
            }
        }
        if let Err(e) = stall.check(shared) {
            break e;
        }
    };
    // The peer may have published its last bytes just before hanging up:
    // deliver them first.
    if let FlowError::Closed = failed {
        if let Attempt::Moved(n) = attempt()? {
            return Ok(n);
        }
    }
    Err(failed)
}

/// Copies what fits and, in event mode, wakes a sleeping consumer.
#[inline(always)]
fn attempt_send(ring: &Producer, shared: &Shared, buf: &[u8]) -> Result<Attempt, FlowError> {
    let n = ring.try_write(buf, MAX_COPY_BYTES).map_err(corrupt)?;
    if n == 0 {
        return Ok(Attempt::Blocked {
            expected: ring.cached_tail(),
        });
    }
    if shared.mode == Mode::Event {
        // Fences, then wakes a consumer that armed its word (pairs with
        // its fence between arming and looking again, see `wait_for`).
        ring.take_peer_waiters(|| ());
    }
    Ok(Attempt::Moved(n))
}

/// Copies what there is and, in event mode, wakes a sleeping producer.
#[inline(always)]
fn attempt_recv(ring: &Consumer, shared: &Shared, buf: &mut [u8]) -> Result<Attempt, FlowError> {
    let n = ring.try_read(buf, MAX_COPY_BYTES).map_err(corrupt)?;
    if n == 0 {
        return Ok(Attempt::Blocked {
            expected: ring.cached_head(),
        });
    }
    if shared.mode == Mode::Event {
        ring.take_peer_waiters(|| ());
    }
    Ok(Attempt::Moved(n))
}

impl Sender for ShmSender {
    #[inline]
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.abort_check.tick(&self.shared)?;
        let (ring, shared) = (&self.ring, &*self.shared);
        let seen = match attempt_send(ring, shared, buf)? {
            Attempt::Moved(n) => return Ok(n),
            Attempt::Blocked { expected } => expected,
        };
        wait_for(shared, ring.waiter(), ring.peer_index(), seen, || {
            attempt_send(ring, shared, buf)
        })
    }
}

impl Receiver for ShmReceiver {
    #[inline]
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.abort_check.tick(&self.shared)?;
        let (ring, shared) = (&self.ring, &*self.shared);
        let seen = match attempt_recv(ring, shared, buf)? {
            Attempt::Moved(n) => return Ok(n),
            Attempt::Blocked { expected } => expected,
        };
        wait_for(shared, ring.waiter(), ring.peer_index(), seen, || {
            attempt_recv(ring, shared, buf)
        })
    }
}

impl Flow for ShmFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }

    fn abort_handle(&self) -> Option<super::AbortHandle> {
        let shared = Arc::downgrade(&self.tx.shared);
        Some(super::AbortHandle::weak(shared, Shared::abort))
    }
}

/// The listening end of one point: the socket file and the region to hand
/// to the one peer it accepts.
struct ShmListener {
    listener: UnixListener,
    /// Its socket file, in this process's own directory; removed when the
    /// listener goes.
    path: crate::sockdir::SocketPath,
    /// The region and its memfd until a peer takes them.
    pending: Option<(Region, std::os::fd::OwnedFd)>,
    config: FlowConfig,
}

impl Listener for ShmListener {
    fn addr(&self) -> String {
        self.path.path().display().to_string()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
        if self.pending.is_none() {
            return Err(listen_err(io::Error::other(
                "this shm listener already handed its region to a peer",
            )));
        }
        let ready = sys::wait_readable(self.listener.as_fd(), timeout).map_err(|e| {
            listen_err(io::Error::new(e.kind(), format!("waiting for a peer: {e}")))
        })?;
        if !ready {
            return Err(TransportError::AcceptTimeout {
                transport: NAME,
                timeout_ms: timeout.as_millis(),
            });
        }
        let (stream, _) = self
            .listener
            .accept()
            .map_err(|e| listen_err(io::Error::new(e.kind(), format!("accept: {e}"))))?;
        // One peer per listener: its name can go now, in this process's
        // own directory.
        let _ = std::fs::remove_file(self.path.path());
        let (region, memfd) = self
            .pending
            .take()
            .ok_or_else(|| listen_err(io::Error::other("shm listener lost its region")))?;
        sys::send_fd(&stream, memfd.as_fd(), HELLO).map_err(listen_err)?;
        drop(memfd);
        let flow = ShmFlow::new(region, stream, Role::Listener, &self.config);
        Ok(Box::new(flow))
    }
}

impl Transport for Shm {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "shared memory: one memfd ring per direction, futex or spin waits (same host only)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            programs: crate::Programs::Library,
            ..Capabilities::local_stream(&[])
        }
    }

    fn availability(&self) -> Result<(), Unavailable> {
        if !cfg!(target_os = "linux") {
            return Err(Unavailable("shm needs Linux (memfd_create, futex)".into()));
        }
        nix::sys::memfd::memfd_create(
            c"netgap-shm-probe",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .map(drop)
        .map_err(|e| Unavailable(format!("memfd_create failed: {e}")))
    }

    fn listen(
        &self,
        config: &FlowConfig,
        _local_ip: std::net::IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let pending = region::create(RING_CAPACITY_BYTES, config.mode).map_err(listen_err)?;
        let path = crate::sockdir::SocketPath::new("shm").map_err(listen_err)?;
        let listener = UnixListener::bind(path.path()).map_err(|e| {
            listen_err(io::Error::new(
                e.kind(),
                format!("binding {}: {e}", path.path().display()),
            ))
        })?;
        Ok(Box::new(ShmListener {
            listener,
            path,
            pending: Some(pending),
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        let connect_err = |source| TransportError::Connect {
            transport: NAME,
            addr: addr.to_string(),
            source,
        };
        if addr.is_empty() {
            return Err(TransportError::BadAddress {
                transport: NAME,
                addr: addr.to_string(),
                detail: "expected the path of the listener's socket file".into(),
            });
        }
        let stream = UnixStream::connect(addr).map_err(|e| TransportError::Connect {
            transport: NAME,
            addr: format!("{addr} (shm needs the agent on this host)"),
            source: e,
        })?;
        // The listener sends the memfd as soon as it accepts; never wait for
        // it longer than the data path would wait for bytes.
        stream
            .set_read_timeout(Some(config.io_timeout.max(Duration::from_millis(1))))
            .map_err(|e| TransportError::Option {
                transport: NAME,
                option: "SO_RCVTIMEO",
                source: e,
            })?;
        let fd = sys::recv_fd(&stream, HELLO).map_err(connect_err)?;
        let region = region::open(fd, config.mode).map_err(connect_err)?;
        let flow = ShmFlow::new(region, stream, Role::Connector, config);
        Ok(Box::new(flow))
    }
}

#[cfg(test)]
mod tests;
