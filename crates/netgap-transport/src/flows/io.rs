//! How the engine's workers move bytes: the seam between the engine and
//! the transports it carries. The engine owns the sockets (non-blocking
//! TCP, or UDP for a datagram path, set up with the transport's options)
//! and their readiness (one epoll instance per worker); a transport's
//! [`DataPath`] says which sockets and owns the system calls that move
//! payload. `tcp` moves bytes with `read`/`write` ([`SYSCALLS`]); `uring`
//! with `IORING_OP_RECV`/`IORING_OP_SEND` on a ring of each worker's own
//! (see [`crate::uring`]); `udp` one datagram per `read`/`send` on each
//! client flow's connected UDP socket ([`DATAGRAMS`]). A transport offers
//! its data path through [`crate::Transport::engine_path`].

use crate::rate::RateBudget;
use std::fmt::Debug;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transport's way of moving bytes on the engine's non-blocking
/// connections. Stateless: each worker gets its own [`WorkerIo`].
pub trait DataPath: Sync {
    /// The transport's name, for errors.
    fn name(&self) -> &'static str;

    /// The I/O state of one worker (a ring, for io_uring), made on the
    /// thread that prepares the worker and then moved to it.
    fn worker(&self) -> io::Result<Box<dyn WorkerIo>>;

    /// Whether the flows are UDP sockets carrying one datagram per message
    /// (netgap's udp header, a sequence number per request, retries on
    /// loss) instead of TCP connections; such a path has no connection to
    /// set up, so it runs pingpong flows only.
    fn datagrams(&self) -> bool {
        false
    }
}

/// One worker's way of reading and writing its flows' sockets. Calls never
/// block: a socket with nothing to read or no room to write is
/// [`io::ErrorKind::WouldBlock`], and the worker waits in epoll (event
/// mode) or spins (poll mode).
pub trait WorkerIo: Send + Debug {
    /// Reads what is there into `buf` (non-empty); 0 is end of stream.
    fn read(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes what the socket takes of `buf` (non-empty).
    fn write(&mut self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize>;
}

/// Plain `read`/`write` system calls: the data path of `tcp`.
#[derive(Debug, Clone, Copy)]
pub struct Syscalls;

/// The data path of `tcp`.
pub static SYSCALLS: Syscalls = Syscalls;

impl DataPath for Syscalls {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn worker(&self) -> io::Result<Box<dyn WorkerIo>> {
        Ok(Box::new(Syscalls))
    }
}

/// Plain system calls on UDP sockets: the data path of `udp`. Each `read`
/// on a client flow's connected socket is one datagram and each write one
/// `send` of a whole datagram; the server answers every flow from one
/// unconnected socket per worker with `recvfrom`/`sendto`.
#[derive(Debug, Clone, Copy)]
pub struct Datagrams;

/// The data path of `udp`.
pub static DATAGRAMS: Datagrams = Datagrams;

impl DataPath for Datagrams {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn worker(&self) -> io::Result<Box<dyn WorkerIo>> {
        Ok(Box::new(Syscalls))
    }

    fn datagrams(&self) -> bool {
        true
    }
}

impl WorkerIo for Syscalls {
    fn read(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // whole call and `fd` is an open descriptor borrowed for it.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    fn write(&mut self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        // MSG_NOSIGNAL: a peer that resets must be an error, not SIGPIPE.
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the
        // whole call and `fd` is an open socket borrowed for it.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }
}

/// The data path of one worker of an engine run with `config`: the
/// transport's, charging every byte it moves to the run's rate budget
/// when it has one.
pub(crate) fn worker_io(config: &super::EngineConfig) -> io::Result<Box<dyn WorkerIo>> {
    let io = config.path.worker()?;
    Ok(match &config.rate {
        Some(budget) => Box::new(PacedIo {
            inner: io,
            budget: Arc::clone(budget),
        }),
        None => io,
    })
}

/// A worker's data path that charges what it moves to a rate budget. It
/// never waits itself (its calls do not block): the worker stops pumping
/// while the budget is ahead ([`ahead`]) and sleeps it off
/// ([`wait_for_budget`]) before it waits for readiness again.
#[derive(Debug)]
struct PacedIo {
    inner: Box<dyn WorkerIo>,
    budget: Arc<RateBudget>,
}

impl WorkerIo for PacedIo {
    fn read(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(fd, buf)?;
        self.budget.charge(n as u64);
        Ok(n)
    }

    fn write(&mut self, fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(fd, buf)?;
        self.budget.charge(n as u64);
        Ok(n)
    }
}

/// Whether a worker paced by `budget` has moved more than it may by now:
/// it then leaves its other ready flows for after [`wait_for_budget`]
/// (readiness is level-triggered, so none is lost).
pub(crate) fn ahead(budget: Option<&RateBudget>) -> bool {
    budget.is_some_and(|b| !b.ahead().is_zero())
}

/// Sleeps while `budget` is ahead, at most `max`, in slices that check
/// `stop`.
pub(crate) fn wait_for_budget(budget: Option<&RateBudget>, stop: &AtomicBool, max: Duration) {
    let Some(budget) = budget else {
        return;
    };
    let until = Instant::now() + max;
    loop {
        let wait = budget.ahead();
        let left = until.saturating_duration_since(Instant::now());
        if wait.is_zero() || left.is_zero() || stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(wait.min(left).min(crate::rate::WAIT_SLICE));
    }
}

/// A flow's socket as the state machines see it: `Read + Write` through
/// the worker's data path.
pub(crate) struct Io<'a> {
    fd: BorrowedFd<'a>,
    path: &'a mut dyn WorkerIo,
}

impl<'a> Io<'a> {
    /// `fd` moved through `path`.
    pub(crate) fn new(fd: BorrowedFd<'a>, path: &'a mut dyn WorkerIo) -> Io<'a> {
        Io { fd, path }
    }
}

impl Read for Io<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.path.read(self.fd, buf)
    }
}

impl Write for Io<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.path.write(self.fd, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
