//! Kernel TCP whose data path is driven through io_uring instead of
//! `read`/`write` system calls. The connection itself is made by the tcp
//! transport's helpers (`listen_socket`, `accept_stream`,
//! `connect_stream`), so every socket option (TCP_NODELAY, buffer sizes,
//! congestion control, SO_BUSY_POLL, ...) is applied exactly as for `tcp`;
//! only the way bytes move differs, which is what the comparison measures.
//! tcp's own data-path hooks (MSG_ZEROCOPY sends, TCP_CORK around each
//! message, TCP_QUICKACK re-armed after each receive) are not applied here:
//! their socket options are set once, the sends and receives stay plain.
//!
//! Each half of a flow ([`UringSender`], [`UringReceiver`]) owns its own
//! small ring and its own handle (a `dup`) on the socket, registered in the
//! ring as fixed file 0, so the two halves can run on two threads at once
//! without sharing a queue. Sends are `IORING_OP_SEND`, receives
//! `IORING_OP_RECV` into the caller's buffer (no provided-buffer copy).
//!
//! What is batched into one `io_uring_enter`:
//! - submission and the wait for the completion (event mode);
//! - the pieces of a large `send_all`, `recv_exact` or (poll mode)
//!   `recv_discard`: up to [`MAX_CHAIN`] pieces of [`CHUNK_BYTES`], each
//!   with `MSG_WAITALL`, linked with `IOSQE_IO_LINK` so they run in order and
//!   the kernel starts the next piece without waiting for user space;
//! - the cancellations of every piece still in flight after a timeout.
//!
//! `--mode event` submits and sleeps in the kernel until a completion
//! arrives, with the inactivity timeout as the wait's timeout
//! (`IORING_ENTER_EXT_ARG`). `--mode poll` submits, then spins on the
//! completion queue in user space; the ring is set up with
//! `IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG`, so the kernel is
//! entered (without waiting) only when it flags pending completion work.
//! `--sqpoll` adds `IORING_SETUP_SQPOLL`: a kernel thread, shared by every
//! ring of the process, picks submissions up, so neither mode needs a system
//! call to submit (except to wake an idle thread). It also runs the rings'
//! completion work, so on a machine with no spare core a poll-mode spinner
//! yields its CPU after a while without progress.
//!
//! Safety invariant: a buffer handed to the kernel is borrowed for the whole
//! call that submitted it, and no call returns (nor unwinds) before every
//! operation it submitted has completed; on a timeout or error the pieces
//! still in flight are cancelled (`IORING_OP_ASYNC_CANCEL`) and their
//! completions awaited first. Between calls a ring has nothing in flight.

use super::options::{OptionDecl, OptionKind, RCVBUF, SNDBUF};
use super::tcp::{self, accept_stream, connect_stream, connect_stream_from, listen_socket};
use super::{
    Capabilities, Flow, FlowConfig, FlowError, Listener, Receiver, Sender, Transport,
    TransportError, Unavailable,
};
use io_uring::{opcode, squeue, types, IoUring};
use netgap_core::spec::{Mode, TransportOptions};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use socket2::Protocol;
use std::io;
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const NAME: &str = "uring";

/// Bytes per piece of a linked chain; a piece's completion is the unit of
/// progress the inactivity timeout watches.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Most pieces in one linked chain (one `io_uring_enter`); at most 32, the
/// width of the in-flight bit mask.
pub const MAX_CHAIN: usize = 16;

/// Largest single send or receive of `send_some`/`recv_some`, in bytes (the
/// SQE length field is 32 bits).
const MAX_OP_BYTES: usize = 1 << 30;

/// Submission queue entries per ring: a full chain plus one cancellation per
/// piece.
const SQ_ENTRIES: u32 = 2 * MAX_CHAIN as u32;

/// How long an idle SQPOLL kernel thread keeps polling before it sleeps, in
/// milliseconds.
pub(crate) const SQPOLL_IDLE_MS: u32 = 10;

/// Poll mode with SQPOLL: spins without progress before each further spin
/// also yields the CPU, since the completions are produced by the kernel
/// submission thread, which may need this very CPU.
const SQPOLL_SPINS_BEFORE_YIELD: u32 = 1024;

/// Spins between clock reads in poll mode (as in the plain socket flows).
const SPINS_PER_CLOCK_READ: u32 = 64;

/// After a cancellation, how long to wait for the cancelled operations
/// before shutting the socket down to force them to complete.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// After the shutdown, how long to wait before giving up on the kernel and
/// aborting the process (the alternative would be to return while the
/// kernel may still write into the caller's buffer).
const CANCEL_ABORT_AFTER: Duration = Duration::from_secs(30);

const _: () = assert!(MAX_CHAIN >= 1 && MAX_CHAIN <= 32);

/// Marks the user data of cancellation requests; a piece's user data is its
/// index in the chain.
const CANCEL_TAG: u64 = 1 << 32;

/// The socket is fixed file 0 of every ring.
const SOCKET: types::Fixed = types::Fixed(0);

/// TCP driven through io_uring.
pub(crate) struct Uring;

/// `--sqpoll`: IORING_SETUP_SQPOLL, a kernel thread polls the submission
/// queue; applied by `build_ring`.
pub(crate) static SQPOLL: OptionDecl = OptionDecl {
    flag: "sqpoll",
    kind: OptionKind::Switch,
    value_name: "",
    help: "io_uring kernel-side submission polling.",
    record: |o, _| {
        o.sqpoll = true;
        Ok(())
    },
};

/// The options uring honours: the TCP socket options its sockets get from
/// tcp's setup, and its own.
pub(crate) static OPTIONS: &[&OptionDecl] = &[
    &tcp::NO_NODELAY,
    &SNDBUF,
    &RCVBUF,
    &tcp::BUSY_POLL,
    &tcp::CONGESTION,
    &SQPOLL,
];

/// Why io_uring cannot be used here, probed once per process.
static AVAILABILITY: OnceLock<Result<(), Unavailable>> = OnceLock::new();

/// An I/O error's text without the " (os error N)" suffix.
fn plain(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Explains a failed `io_uring_setup` in one line.
fn describe_setup_error(e: &io::Error, disabled: Option<u32>) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => format!(
            "io_uring_setup not available: {} (kernel built without io_uring)",
            plain(e)
        ),
        Some(libc::EPERM) if disabled == Some(1) => format!(
            "io_uring_setup refused: {} (/proc/sys/kernel/io_uring_disabled is 1 and this \
             process is not in kernel.io_uring_group)",
            plain(e)
        ),
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "io_uring_setup refused: {} (a sandbox or io_uring_disabled forbids it)",
            plain(e)
        ),
        _ => format!("io_uring_setup failed: {}", plain(e)),
    }
}

/// Creates a tiny ring and runs one no-op through it.
fn probe() -> Result<(), Unavailable> {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if disabled == Some(2) {
        return Err(Unavailable(
            "io_uring is disabled on this host (/proc/sys/kernel/io_uring_disabled is 2)".into(),
        ));
    }
    let mut ring = IoUring::new(2).map_err(|e| Unavailable(describe_setup_error(&e, disabled)))?;
    if !ring.params().is_feature_ext_arg() {
        return Err(Unavailable(
            "kernel io_uring too old: no IORING_FEAT_EXT_ARG for timed waits (needs Linux 5.11)"
                .into(),
        ));
    }
    let mut ops = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut ops).is_ok() {
        for (code, name) in [
            (opcode::Send::CODE, "IORING_OP_SEND"),
            (opcode::Recv::CODE, "IORING_OP_RECV"),
            (opcode::AsyncCancel::CODE, "IORING_OP_ASYNC_CANCEL"),
        ] {
            if !ops.is_supported(code) {
                return Err(Unavailable(format!("kernel io_uring lacks {name}")));
            }
        }
    }
    let nop = opcode::Nop::new().build().user_data(7);
    // SAFETY: a no-op carries no buffer.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| Unavailable("io_uring probe: submission queue full".into()))?;
    ring.submit_and_wait(1).map_err(|e| {
        Unavailable(format!(
            "io_uring_enter refused: {} (a sandbox forbids it)",
            plain(&e)
        ))
    })?;
    let done = ring.completion().next().map(|c| c.user_data());
    match done {
        Some(7) => Ok(()),
        _ => Err(Unavailable(
            "io_uring probe: the no-op did not complete".into(),
        )),
    }
}

fn option_error(option: &'static str, source: io::Error) -> TransportError {
    TransportError::Option {
        transport: NAME,
        option,
        source,
    }
}

/// Builds one ring for `options`; with `sqpoll`, `attach` is the ring whose
/// SQPOLL thread this one shares.
fn build_ring(
    options: &TransportOptions,
    attach: Option<RawFd>,
) -> Result<IoUring, TransportError> {
    if options.sqpoll {
        let mut b = IoUring::builder();
        b.setup_sqpoll(SQPOLL_IDLE_MS);
        if let Some(fd) = attach {
            b.setup_attach_wq(fd);
        }
        let built = match b.build(SQ_ENTRIES) {
            // Sharing the thread is an optimisation; older kernels refuse it.
            Err(e) if attach.is_some() && e.raw_os_error() == Some(libc::EINVAL) => {
                IoUring::builder()
                    .setup_sqpoll(SQPOLL_IDLE_MS)
                    .build(SQ_ENTRIES)
            }
            other => other,
        };
        return built.map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EPERM) => {
                    " (SQPOLL needs Linux 5.11+ or CAP_SYS_NICE, and no sandbox forbidding it)"
                }
                Some(libc::EINVAL) => " (this kernel does not support SQPOLL as asked)",
                _ => "",
            };
            option_error(
                "IORING_SETUP_SQPOLL",
                io::Error::new(
                    e.kind(),
                    format!("io_uring_setup with SQPOLL failed: {}{hint}", plain(&e)),
                ),
            )
        });
    }
    // Cooperative task running (5.19+): no interrupt per completion; the
    // taskrun flag tells a spinning poller when to enter the kernel.
    let built = match IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(SQ_ENTRIES)
    {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(SQ_ENTRIES),
        other => other,
    };
    built.map_err(|e| {
        option_error(
            "io_uring_setup",
            io::Error::new(e.kind(), format!("io_uring_setup failed: {}", plain(&e))),
        )
    })
}

/// A ring whose only job is to own the process's SQPOLL kernel thread:
/// every `--sqpoll` ring attaches to it (`IORING_SETUP_ATTACH_WQ`), so the
/// process runs one submission thread however many rings it has (on
/// loopback the client and the in-process agent share it, which leaves more
/// of a small machine to the threads being measured). `None` when SQPOLL
/// cannot be set up; each flow then fails with its own error.
static SQPOLL_ANCHOR: OnceLock<Option<IoUring>> = OnceLock::new();

/// The fd of the [`SQPOLL_ANCHOR`] ring, created on first use.
///
/// The kernel thread inherits the CPU affinity of the thread that creates
/// the ring, and the first flow is usually made by a role already pinned
/// with `--pin`; so the ring is made on a helper thread allowed on every
/// CPU (as far as the cpuset permits), leaving the kernel free to place the
/// submission thread away from the measured threads.
fn sqpoll_anchor() -> Option<RawFd> {
    SQPOLL_ANCHOR
        .get_or_init(|| {
            let make = || {
                let mut all = CpuSet::new();
                for cpu in 0..CpuSet::count() {
                    let _ = all.set(cpu);
                }
                // The kernel keeps only the CPUs the cpuset allows; failing
                // that, the ring inherits this thread's affinity.
                let _ = sched_setaffinity(Pid::from_raw(0), &all);
                IoUring::builder()
                    .setup_sqpoll(SQPOLL_IDLE_MS)
                    .build(2)
                    .ok()
            };
            std::thread::Builder::new()
                .name("uring sqpoll".into())
                .spawn(make)
                .ok()
                .and_then(|h| h.join().ok())
                .flatten()
        })
        .as_ref()
        .map(|r| r.as_raw_fd())
}

/// Which way a piece moves bytes.
enum Buf<'a> {
    /// Send from this slice.
    Out(&'a [u8]),
    /// Receive into this slice.
    In(&'a mut [u8]),
}

impl Buf<'_> {
    fn len(&self) -> usize {
        match self {
            Buf::Out(b) => b.len(),
            Buf::In(b) => b.len(),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Buf::Out(_) => "send",
            Buf::In(_) => "recv",
        }
    }
}

/// Length of piece `i` of a transfer of `len` bytes, `whole` or not.
fn piece_len(len: usize, whole: bool, i: usize) -> usize {
    if whole {
        (len - i * CHUNK_BYTES).min(CHUNK_BYTES)
    } else {
        len.min(MAX_OP_BYTES)
    }
}

/// Maps a negative CQE result to a flow error.
fn cqe_error(errno: i32, what: &str, timeout: Duration) -> FlowError {
    match errno {
        libc::ETIME => FlowError::TimedOut {
            timeout_ms: timeout.as_millis(),
        },
        libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED => FlowError::Closed,
        _ => match FlowError::from_io(io::Error::from_raw_os_error(errno), timeout) {
            FlowError::Io(e) => {
                FlowError::Io(io::Error::new(e.kind(), format!("io_uring {what}: {e}")))
            }
            other => other,
        },
    }
}

/// One half of a flow: a ring plus a handle on the socket, registered in the
/// ring as fixed file 0.
///
/// Invariant: between calls no operation is in flight (`pending == 0`).
struct Half {
    ring: IoUring,
    /// The socket handle the ring's fixed file refers to; shut down only as
    /// the last resort of a stuck cancellation.
    socket: TcpStream,
    mode: Mode,
    /// The ring has an SQPOLL kernel thread.
    sqpoll: bool,
    /// Inactivity timeout of the data path.
    timeout: Duration,
    /// Result of piece `i` of the current chain, valid once its bit in
    /// `pending` is clear.
    results: [i32; MAX_CHAIN],
    /// Bit `i` set while piece `i` of the current chain is in flight.
    pending: u32,
    /// Reused staging area for the SQEs of a chain (no allocation per call).
    entries: Vec<squeue::Entry>,
}

/// Cancels and reaps whatever is still in flight when dropped, so no path
/// out of a transfer (error, timeout or unwinding) leaves the kernel with a
/// buffer the caller may reuse.
struct InFlight<'a>(&'a mut Half);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.pending != 0 {
            self.0.cancel_and_drain();
        }
    }
}

impl Half {
    fn new(
        socket: TcpStream,
        config: &FlowConfig,
        attach: Option<RawFd>,
    ) -> Result<Half, TransportError> {
        let ring = build_ring(&config.options, attach)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(option_error(
                "IORING_FEAT_EXT_ARG",
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "kernel io_uring has no timed waits (needs Linux 5.11)",
                ),
            ));
        }
        ring.submitter()
            .register_files(&[socket.as_raw_fd()])
            .map_err(|e| option_error("IORING_REGISTER_FILES", e))?;
        Ok(Half {
            ring,
            socket,
            mode: config.mode,
            sqpoll: config.options.sqpoll,
            timeout: config.io_timeout,
            results: [0; MAX_CHAIN],
            pending: 0,
            entries: Vec::with_capacity(MAX_CHAIN),
        })
    }

    /// Moves bytes of `buf` in one submission: with `whole`, up to
    /// [`MAX_CHAIN`] linked `MSG_WAITALL` pieces of [`CHUNK_BYTES`]; without,
    /// one plain operation. Returns how many bytes moved (at least 1).
    fn transfer(&mut self, mut buf: Buf<'_>, whole: bool) -> Result<usize, FlowError> {
        let len = buf.len();
        if len == 0 {
            return Ok(0);
        }
        let what = buf.what();
        let n = if whole {
            len.div_ceil(CHUNK_BYTES).min(MAX_CHAIN)
        } else {
            1
        };
        let waitall = if whole { libc::MSG_WAITALL } else { 0 };
        // Receives write through a pointer taken from the `&mut` slice.
        let (out, base) = match &mut buf {
            Buf::Out(b) => (true, b.as_ptr().cast_mut()),
            Buf::In(b) => (false, b.as_mut_ptr()),
        };
        self.entries.clear();
        for i in 0..n {
            let at = base.wrapping_add(if whole { i * CHUNK_BYTES } else { 0 });
            let l = piece_len(len, whole, i) as u32;
            let e = if out {
                opcode::Send::new(SOCKET, at.cast_const(), l)
                    .flags(libc::MSG_NOSIGNAL | waitall)
                    .build()
            } else {
                opcode::Recv::new(SOCKET, at, l).flags(waitall).build()
            };
            let e = e.user_data(i as u64);
            self.entries.push(if i + 1 < n {
                e.flags(squeue::Flags::IO_LINK)
            } else {
                e
            });
        }
        {
            let mut sq = self.ring.submission();
            // SAFETY: every entry points into `buf`, which is borrowed for
            // this whole call; the `InFlight` guard below does not let the
            // call return or unwind before each entry's completion has been
            // reaped (cancelling the ones still running first). Receives
            // point into a `&mut` slice, so the kernel writes nothing the
            // caller can see meanwhile.
            unsafe { sq.push_multiple(&self.entries) }.map_err(|_| {
                FlowError::Io(io::Error::other(
                    "io_uring submission queue unexpectedly full",
                ))
            })?;
        }
        self.pending = u32::MAX >> (32 - n);
        let guard = InFlight(self);
        let waited = match guard.0.mode {
            Mode::Event => guard.0.wait_event(),
            Mode::Poll => guard.0.wait_poll(),
        };
        drop(guard);
        waited?;
        self.tally(len, whole, n, what)
    }

    /// Bytes moved by the chain just completed; the first failure ends it.
    fn tally(&self, len: usize, whole: bool, n: usize, what: &str) -> Result<usize, FlowError> {
        let mut done = 0usize;
        for (i, &r) in self.results.iter().enumerate().take(n) {
            if r < 0 {
                if done > 0 {
                    // The caller goes on and meets the error on its own.
                    break;
                }
                return Err(cqe_error(-r, what, self.timeout));
            }
            let r = r as usize;
            done += r;
            if r < piece_len(len, whole, i) {
                break;
            }
        }
        if done == 0 {
            // A receive of 0 bytes is the peer's FIN.
            return Err(FlowError::Closed);
        }
        Ok(done)
    }

    /// Takes every completion queued now; true when a piece moved bytes.
    #[inline]
    fn reap(&mut self) -> bool {
        let mut progress = false;
        for cqe in self.ring.completion() {
            let ud = cqe.user_data();
            if ud & CANCEL_TAG != 0 {
                continue;
            }
            let i = ud as usize;
            if let Some(slot) = self.results.get_mut(i) {
                *slot = cqe.result();
                self.pending &= !(1u32 << i);
                progress |= cqe.result() > 0;
            }
        }
        progress
    }

    fn timed_out(&self) -> FlowError {
        FlowError::TimedOut {
            timeout_ms: self.timeout.as_millis(),
        }
    }

    /// Event mode: submits and sleeps in the kernel until every piece has
    /// completed; fails when no piece completes for the whole timeout.
    fn wait_event(&mut self) -> Result<(), FlowError> {
        let mut deadline: Option<Instant> = None;
        loop {
            let progress = self.reap();
            if self.pending == 0 {
                return Ok(());
            }
            let now = Instant::now();
            let d = match deadline {
                Some(d) if !progress => d,
                _ => now + self.timeout,
            };
            deadline = Some(d);
            if now >= d {
                return Err(self.timed_out());
            }
            let ts = types::Timespec::from(d - now);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    return Err(FlowError::Io(io::Error::new(
                        e.kind(),
                        format!("io_uring_enter: {e}"),
                    )))
                }
            }
        }
    }

    /// Poll mode: submits, then spins on the completion queue, entering the
    /// kernel only to submit or when it flags pending completion work.
    fn wait_poll(&mut self) -> Result<(), FlowError> {
        let mut deadline: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let enter = {
                let sq = self.ring.submission();
                !sq.is_empty() || sq.taskrun()
            };
            if enter {
                match self.ring.submit() {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) => {}
                    Err(e) => {
                        return Err(FlowError::Io(io::Error::new(
                            e.kind(),
                            format!("io_uring_enter: {e}"),
                        )))
                    }
                }
            }
            if self.reap() {
                if self.pending == 0 {
                    return Ok(());
                }
                deadline = None;
                spins = 0;
            }
            if self.pending == 0 {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                let now = Instant::now();
                match deadline {
                    None => deadline = Some(now + self.timeout),
                    Some(d) if now >= d => return Err(self.timed_out()),
                    Some(_) => {}
                }
            }
            if self.sqpoll && spins >= SQPOLL_SPINS_BEFORE_YIELD {
                // The kernel thread does this ring's work; on a busy
                // machine it may be waiting for this very CPU.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Cancels every piece still in flight and waits for all their
    /// completions. If they do not come within [`CANCEL_GRACE`], shuts the
    /// socket down, which completes any socket operation; if even that does
    /// not work within [`CANCEL_ABORT_AFTER`], aborts the process rather
    /// than let the kernel write into memory the caller may reuse.
    fn cancel_and_drain(&mut self) {
        for i in 0..MAX_CHAIN {
            if self.pending & (1u32 << i) == 0 {
                continue;
            }
            let cancel = opcode::AsyncCancel::new(i as u64)
                .build()
                .user_data(CANCEL_TAG | i as u64);
            // SAFETY: a cancellation carries no buffer, only user data.
            if unsafe { self.ring.submission().push(&cancel) }.is_err() {
                // No room: what is queued goes in first, then retry once;
                // the shutdown below covers a cancellation that never went.
                let _ = self.ring.submit();
                // SAFETY: as above.
                let _ = unsafe { self.ring.submission().push(&cancel) };
            }
        }
        let start = Instant::now();
        let mut shut = false;
        loop {
            self.reap();
            if self.pending == 0 {
                return;
            }
            let waited = start.elapsed();
            if !shut && waited >= CANCEL_GRACE {
                let _ = self.socket.shutdown(Shutdown::Both);
                shut = true;
            }
            if waited >= CANCEL_GRACE + CANCEL_ABORT_AFTER {
                eprintln!(
                    "netgap: io_uring operations still in flight {} s after their \
                     cancellation; aborting rather than let the kernel use memory the caller may reuse",
                    waited.as_secs()
                );
                std::process::abort();
            }
            let ts = types::Timespec::from(Duration::from_millis(100));
            let args = types::SubmitArgs::new().timespec(&ts);
            // Any error is retried until the deadlines above.
            let _ = self.ring.submitter().submit_with_args(1, &args);
        }
    }

    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        self.transfer(Buf::Out(buf), false)
    }

    fn send_all(&mut self, mut buf: &[u8]) -> Result<(), FlowError> {
        while !buf.is_empty() {
            let n = self.transfer(Buf::Out(buf), true)?;
            buf = &buf[n..];
        }
        Ok(())
    }

    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        self.transfer(Buf::In(buf), false)
    }

    fn recv_exact(&mut self, mut buf: &mut [u8]) -> Result<(), FlowError> {
        while !buf.is_empty() {
            let n = self.transfer(Buf::In(buf), true)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// Bulk receive. In poll mode, `MSG_WAITALL` chains: the kernel keeps
    /// filling the buffer while the thread spins. In event mode, plain
    /// receives, as `read` does: a `MSG_WAITALL` receive keeps the thread
    /// asleep across many small arrivals, each costing the sender a full
    /// wake-up of it, while a plain one returns and takes whatever arrives
    /// meanwhile in one go (measured: 64 B streams ran about 2x faster).
    fn recv_discard(&mut self, mut total_bytes: u64, scratch: &mut [u8]) -> Result<(), FlowError> {
        let whole = self.mode == Mode::Poll;
        while total_bytes > 0 {
            let want = scratch
                .len()
                .min(usize::try_from(total_bytes).unwrap_or(usize::MAX));
            let n = self.transfer(Buf::In(&mut scratch[..want]), whole)?;
            total_bytes -= n as u64;
        }
        Ok(())
    }
}

impl Drop for Half {
    fn drop(&mut self) {
        // Release the ring's reference on the socket now rather than in the
        // ring's deferred teardown, so the peer sees the close at once.
        let _ = self.ring.submitter().unregister_files();
    }
}

/// The sending half of a uring flow: its own ring and socket handle.
pub struct UringSender(Half);

/// The receiving half of a uring flow: its own ring and socket handle.
pub struct UringReceiver(Half);

impl Sender for UringSender {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        self.0.send_some(buf)
    }

    /// Sends all of `buf` as linked `MSG_WAITALL` pieces, [`MAX_CHAIN`] per
    /// `io_uring_enter`.
    fn send_all(&mut self, buf: &[u8]) -> Result<(), FlowError> {
        self.0.send_all(buf)
    }
}

impl Receiver for UringReceiver {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        self.0.recv_some(buf)
    }

    /// Fills `buf` with linked `MSG_WAITALL` pieces, [`MAX_CHAIN`] per
    /// `io_uring_enter`.
    fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), FlowError> {
        self.0.recv_exact(buf)
    }

    /// Receives `total_bytes` into `scratch`: `MSG_WAITALL` pieces in poll
    /// mode, plain receives in event mode.
    fn recv_discard(&mut self, total_bytes: u64, scratch: &mut [u8]) -> Result<(), FlowError> {
        self.0.recv_discard(total_bytes, scratch)
    }
}

/// A TCP connection driven through two io_uring instances, one per half.
pub(crate) struct UringFlow {
    tx: UringSender,
    rx: UringReceiver,
}

impl UringFlow {
    /// Wraps a connected, blocking TCP stream (options already applied).
    /// With `sqpoll`, both rings share the process's kernel submission
    /// thread.
    pub(crate) fn new(stream: TcpStream, config: &FlowConfig) -> Result<UringFlow, TransportError> {
        let rx_socket = stream
            .try_clone()
            .map_err(|e| option_error("dup (second socket handle)", e))?;
        let attach = if config.options.sqpoll {
            sqpoll_anchor()
        } else {
            None
        };
        let tx = Half::new(stream, config, attach)?;
        let rx = Half::new(rx_socket, config, attach)?;
        Ok(UringFlow {
            tx: UringSender(tx),
            rx: UringReceiver(rx),
        })
    }
}

impl Flow for UringFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn data_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(&self.tx.0.socket))
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }
}

struct UringDataListener {
    listener: TcpListener,
    config: FlowConfig,
}

impl Listener for UringDataListener {
    fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn Flow>, TransportError> {
        let stream = accept_stream(NAME, &self.listener, &self.config.options, timeout)?;
        Ok(Box::new(UringFlow::new(stream, &self.config)?))
    }
}

impl Transport for Uring {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "TCP driven through io_uring (batched submissions; --sqpoll for kernel-side submission polling)"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            binds_local: true,
            // Kernel TCP under its sockets.
            framing: Some(crate::Framing::Tcp),
            ..Capabilities::cross_host_stream(OPTIONS)
        }
    }

    /// `Err` when io_uring is disabled, missing, refused by a sandbox or too
    /// old; probed once per process.
    fn availability(&self) -> Result<(), Unavailable> {
        AVAILABILITY.get_or_init(probe).clone()
    }

    fn listen(
        &self,
        config: &FlowConfig,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Listener>, TransportError> {
        Ok(Box::new(UringDataListener {
            listener: listen_socket(NAME, Protocol::TCP, &config.options, local_ip)?,
            config: config.clone(),
        }))
    }

    fn connect(&self, config: &FlowConfig, addr: &str) -> Result<Box<dyn Flow>, TransportError> {
        let stream = connect_stream(NAME, Protocol::TCP, &config.options, addr)?;
        Ok(Box::new(UringFlow::new(stream, config)?))
    }

    fn connect_from(
        &self,
        config: &FlowConfig,
        addr: &str,
        local_ip: IpAddr,
    ) -> Result<Box<dyn Flow>, TransportError> {
        let stream = connect_stream_from(NAME, Protocol::TCP, &config.options, addr, local_ip)?;
        Ok(Box::new(UringFlow::new(stream, config)?))
    }

    fn engine_path(&self) -> Option<&'static dyn crate::flows::DataPath> {
        Some(&ENGINE_PATH)
    }
}

/// The flow engine's data path over io_uring: each engine worker has one
/// ring, and every read or write of its flows is one `IORING_OP_RECV` or
/// `IORING_OP_SEND` with `MSG_DONTWAIT`, submitted and reaped in one
/// `io_uring_enter`. Readiness still comes from the worker's epoll, so the
/// engine's event and poll modes work unchanged; what differs from `tcp` is
/// the path each byte takes into and out of the kernel.
#[derive(Debug)]
pub(crate) struct EnginePath;

/// The data path of `uring` in the flow engine.
pub(crate) static ENGINE_PATH: EnginePath = EnginePath;

impl crate::flows::DataPath for EnginePath {
    fn name(&self) -> &'static str {
        NAME
    }

    fn worker(&self) -> io::Result<Box<dyn crate::flows::WorkerIo>> {
        if let Err(why) = AVAILABILITY.get_or_init(probe) {
            return Err(io::Error::other(why.clone()));
        }
        Ok(Box::new(EngineRing {
            ring: IoUring::new(ENGINE_SQ_ENTRIES)?,
        }))
    }
}

/// Submission queue entries of an engine worker's ring: it has at most one
/// operation in flight.
const ENGINE_SQ_ENTRIES: u32 = 2;

/// One engine worker's ring.
struct EngineRing {
    ring: IoUring,
}

impl std::fmt::Debug for EngineRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineRing")
    }
}

impl EngineRing {
    /// Submits `sqe` and waits for its completion; the result is a byte
    /// count or the operation's error (`EAGAIN` when the socket is not
    /// ready, as `MSG_DONTWAIT` asks).
    ///
    /// # Safety
    /// The buffer `sqe` points to must stay valid until this returns; it
    /// does not return (nor unwind) before the completion is reaped, so a
    /// buffer borrowed for the call suffices.
    unsafe fn run(&mut self, sqe: &squeue::Entry) -> io::Result<usize> {
        // SAFETY: the caller keeps the buffer valid until the completion
        // is reaped below; the ring has nothing else in flight.
        unsafe { self.ring.submission().push(sqe) }
            .map_err(|_| io::Error::other("engine ring: submission queue full"))?;
        let started = Instant::now();
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    // The operation may be in flight with the caller's buffer:
                    // returning now could let the kernel write into freed
                    // memory. MSG_DONTWAIT operations finish at once, so this
                    // is a broken kernel; stop rather than risk it.
                    if started.elapsed() > CANCEL_ABORT_AFTER {
                        eprintln!("netgap: io_uring_enter keeps failing ({e}); aborting");
                        std::process::abort();
                    }
                    std::thread::yield_now();
                    continue;
                }
            }
            if let Some(cqe) = self.ring.completion().next() {
                let res = cqe.result();
                return usize::try_from(res).map_err(|_| io::Error::from_raw_os_error(-res));
            }
        }
    }
}

impl crate::flows::WorkerIo for EngineRing {
    fn read(&mut self, fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len().min(MAX_OP_BYTES)).unwrap_or(u32::MAX);
        let sqe = opcode::Recv::new(types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), len)
            .flags(libc::MSG_DONTWAIT)
            .build();
        // SAFETY: `buf` is borrowed mutably for this whole call and `run`
        // returns only after the operation completed.
        unsafe { self.run(&sqe) }
    }

    fn write(&mut self, fd: std::os::fd::BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len().min(MAX_OP_BYTES)).unwrap_or(u32::MAX);
        let sqe = opcode::Send::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), len)
            .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            .build();
        // SAFETY: `buf` is borrowed for this whole call and `run` returns
        // only after the operation completed.
        unsafe { self.run(&sqe) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const MODES: [Mode; 2] = [Mode::Event, Mode::Poll];

    /// False (with the reason printed) when io_uring cannot run here.
    fn usable() -> bool {
        match Uring.availability() {
            Ok(()) => true,
            Err(why) => {
                eprintln!("skipped: uring not available here: {why}");
                false
            }
        }
    }

    fn config(mode: Mode, sqpoll: bool, io_timeout: Duration) -> FlowConfig {
        FlowConfig {
            mode,
            options: TransportOptions {
                sqpoll,
                ..TransportOptions::default()
            },
            io_timeout,
        }
    }

    /// A connected (client, server) pair of flows.
    type Pair = (Box<dyn Flow>, Box<dyn Flow>);

    /// A connected (client, server) pair over 127.0.0.1.
    fn pair(config: &FlowConfig) -> Result<Pair, TransportError> {
        let mut listener = Uring.listen(config, "127.0.0.1".parse().expect("ip"))?;
        let client = Uring.connect(config, &listener.addr())?;
        let server = listener.accept(Duration::from_secs(5))?;
        Ok((client, server))
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
    }

    /// Client sends, server echoes, client checks every byte.
    fn echo(client: &mut dyn Flow, server: Box<dyn Flow>, sizes: &[usize]) {
        let sizes_srv = sizes.to_vec();
        let srv = thread::spawn(move || {
            let mut server = server;
            for &size in &sizes_srv {
                let mut buf = vec![0u8; size];
                server.recv_exact(&mut buf).expect("server recv");
                assert!(buf == pattern(size, size), "server got corrupt {size} B");
                server.send_all(&buf).expect("server send");
            }
            server
        });
        for &size in sizes {
            let msg = pattern(size, size);
            client.send_all(&msg).expect("client send");
            let mut back = vec![0u8; size];
            client.recv_exact(&mut back).expect("client recv");
            assert!(back == msg, "client got corrupt {size} B echo");
        }
        drop(srv.join().expect("server thread"));
    }

    #[test]
    fn moves_1b_4k_and_8m_messages_in_both_modes() {
        if !usable() {
            return;
        }
        for mode in MODES {
            let (mut client, server) =
                pair(&config(mode, false, Duration::from_secs(10))).expect("pair");
            echo(client.as_mut(), server, &[1, 4096, 8 << 20, 1, 3 << 20]);
        }
    }

    #[test]
    fn recv_some_and_recv_discard_see_every_byte() {
        if !usable() {
            return;
        }
        for mode in MODES {
            let (mut client, mut server) =
                pair(&config(mode, false, Duration::from_secs(10))).expect("pair");
            let msg = pattern(5 << 20, 3);
            let sent = msg.clone();
            let tx = thread::spawn(move || {
                client.send_all(&sent).expect("send");
                client.send_all(&sent).expect("send again");
                client
            });
            let (_, rx) = server.split();
            let mut got = Vec::with_capacity(msg.len());
            let mut buf = vec![0u8; 100_000];
            while got.len() < msg.len() {
                let want = buf.len().min(msg.len() - got.len());
                let n = rx.recv_some(&mut buf[..want]).expect("recv_some");
                assert!(n >= 1);
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == msg, "recv_some corrupted the stream");
            rx.recv_discard(msg.len() as u64, &mut buf)
                .expect("recv_discard");
            drop(tx.join().expect("sender"));
        }
    }

    #[test]
    fn halves_send_and_receive_from_two_threads_at_once() {
        if !usable() {
            return;
        }
        const BYTES: usize = 6 << 20;
        for mode in MODES {
            let (client, server) =
                pair(&config(mode, false, Duration::from_secs(10))).expect("pair");
            let mut threads = Vec::new();
            for (seed, flow) in [(1usize, client), (2usize, server)] {
                let (mut tx, mut rx) = flow.into_halves();
                threads.push(thread::spawn(move || {
                    let msg = pattern(BYTES, seed);
                    // Odd piece sizes: chains of several pieces plus a tail.
                    for piece in msg.chunks((1 << 20) + 17) {
                        tx.send_all(piece).expect("send half");
                    }
                }));
                let peer_seed = 3 - seed;
                threads.push(thread::spawn(move || {
                    let mut got = vec![0u8; BYTES];
                    rx.recv_exact(&mut got).expect("recv half");
                    assert!(got == pattern(BYTES, peer_seed), "corrupt bytes in bibw");
                }));
            }
            for t in threads {
                t.join().expect("half thread");
            }
        }
    }

    #[test]
    fn a_dropped_peer_gives_closed() {
        if !usable() {
            return;
        }
        for mode in MODES {
            let (mut client, server) =
                pair(&config(mode, false, Duration::from_secs(5))).expect("pair");
            drop(server);
            let mut buf = [0u8; 64];
            match client.recv_exact(&mut buf) {
                Err(FlowError::Closed) => {}
                other => panic!("{mode}: recv from a dropped peer gave {other:?}"),
            }
            // Sending eventually meets the reset.
            let big = vec![0u8; 1 << 20];
            let mut outcome = Ok(());
            for _ in 0..64 {
                outcome = client.send_all(&big);
                if outcome.is_err() {
                    break;
                }
            }
            assert!(
                matches!(outcome, Err(FlowError::Closed)),
                "{mode}: send to a dropped peer gave {outcome:?}"
            );
        }
    }

    #[test]
    fn inactivity_timeout_is_honoured_and_cancels_cleanly() {
        if !usable() {
            return;
        }
        let timeout = Duration::from_millis(300);
        for (mode, sqpoll) in [
            (Mode::Event, false),
            (Mode::Poll, false),
            (Mode::Event, true),
            (Mode::Poll, true),
        ] {
            let Ok((mut client, mut server)) = pair(&config(mode, sqpoll, timeout)) else {
                assert!(sqpoll, "{mode}: cannot make a pair");
                continue;
            };
            let mut buf = [0xAAu8; 16];
            let t0 = Instant::now();
            let r = client.recv_exact(&mut buf);
            let took = t0.elapsed();
            assert!(
                matches!(r, Err(FlowError::TimedOut { timeout_ms: 300 })),
                "{mode}: silent peer gave {r:?}"
            );
            assert!(
                took >= Duration::from_millis(280) && took < Duration::from_millis(1500),
                "{mode}: timed out after {took:?}"
            );
            // The cancelled receive took nothing: the flow still carries the
            // next bytes, and into the buffer of the next call only.
            assert_eq!(buf, [0xAA; 16]);
            server.send_all(&[5u8; 16]).expect("late send");
            client.recv_exact(&mut buf).expect("recv after timeout");
            assert_eq!(buf, [5u8; 16]);

            // A large send to a peer that does not read: the chain stalls,
            // is cancelled, and the call fails within about the timeout
            // after the buffers filled.
            let big = vec![1u8; 64 << 20];
            let t0 = Instant::now();
            let r = client.send_all(&big);
            assert!(
                matches!(r, Err(FlowError::TimedOut { .. })),
                "{mode}: send to a stalled peer gave {r:?}"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "{mode}: send stalled too long"
            );
        }
    }

    #[test]
    fn sqpoll_works_or_fails_clearly() {
        if !usable() {
            return;
        }
        for mode in MODES {
            match pair(&config(mode, true, Duration::from_secs(10))) {
                Ok((mut client, server)) => echo(client.as_mut(), server, &[1, 4096, 2 << 20]),
                Err(e) => {
                    let text = e.to_string();
                    assert!(text.contains("SQPOLL"), "unclear sqpoll error: {text}");
                    eprintln!("sqpoll refused here (fine): {text}");
                }
            }
        }
    }

    #[test]
    fn setup_refusals_are_explained_in_one_line() {
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            describe_setup_error(&eperm, Some(0)),
            "io_uring_setup refused: Operation not permitted (a sandbox or io_uring_disabled \
             forbids it)"
        );
        assert!(describe_setup_error(&eperm, Some(1)).contains("io_uring_group"));
        let enosys = io::Error::from_raw_os_error(libc::ENOSYS);
        assert!(describe_setup_error(&enosys, None).contains("kernel built without io_uring"));
    }

    #[test]
    fn availability_is_cached_and_one_line() {
        let a = Uring.availability();
        assert_eq!(a, Uring.availability());
        if let Err(why) = a {
            assert!(!why.0.contains('\n'));
        }
    }
}
