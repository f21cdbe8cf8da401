//! A flow over a connected stream socket (TCP or Unix), shared by the
//! transports that have one. Event mode blocks: receives in `read`, sends in
//! `poll` for room between non-blocking sends (see [`Half::send_event`]);
//! either blocks at most a slice of the inactivity timeout at a time
//! ([`wait_slice`]) and then checks the call's one deadline and whether the
//! flow was ended from another thread. Poll mode makes the socket
//! non-blocking and spins, checking the deadline only while no progress is
//! made.

use super::{Abort, AbortHandle, Flow, FlowError, Receiver, Sender};
use netgap_core::spec::Mode;
use socket2::SockRef;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spins between deadline checks in poll mode; a clock read costs about as
/// much as a failed non-blocking call, so checking every spin would halve the
/// polling rate for nothing.
const SPINS_PER_CLOCK_READ: u32 = 64;

/// Parts of the inactivity timeout one blocking wait may take: a call
/// wakes this often to check its deadline and whether the flow was ended,
/// so neither a late wake-up of one long sleep nor a shutdown the kernel
/// does not report to a blocked call can stretch the silence it names.
const WAIT_SLICES: u32 = 4;

/// The longest one blocking wait of a call with inactivity timeout
/// `timeout` lasts: a [`WAIT_SLICES`]th of it, at least a millisecond.
pub(crate) fn wait_slice(timeout: Duration) -> Duration {
    (timeout / WAIT_SLICES).max(Duration::from_millis(1))
}

/// One half of a stream-socket flow: a handle on the socket plus its mode.
pub(crate) struct Half<S> {
    socket: S,
    mode: Mode,
    timeout: Duration,
    /// Set, for both halves at once, when the flow is ended from another
    /// thread ([`StreamAbort`]).
    ended: Arc<AtomicBool>,
    /// The sends' stall, while they find room only late (see
    /// [`Half::send_event`]).
    stall: Option<SendStall>,
}

/// Sends of one burst that each found room only after waiting a slice or
/// more: a stopped peer's kernel still takes a few more bytes now and then
/// (it compacts its full receive queue and reopens the window, or accepts
/// a probe), and counting each as fresh progress would let such a trickle
/// restart the inactivity clock again and again.
///
/// The room one trickle frees can be caught by more than one send (a
/// spinning sender sees it appear piece by piece as the peer reads), so a
/// send that finds room promptly does not end the stall by itself: the
/// stall ends only after a slice in which no send waited long, or at a
/// pause of a slice between sends.
#[derive(Debug, Clone, Copy)]
struct SendStall {
    /// When the first of these sends began to wait for room.
    since: Instant,
    /// When the last send that waited a slice or more returned.
    last_late: Instant,
    /// When the last send of the burst, late or prompt, returned.
    last_returned: Instant,
}

impl<S> Half<S> {
    /// The error of a call on a flow ended from another thread, if it was.
    fn check_ended(&self) -> Result<(), FlowError> {
        if self.ended.load(Ordering::Acquire) {
            Err(super::aborted())
        } else {
            Ok(())
        }
    }

    /// A handle that ends the flow of this half (and its twin) from another
    /// thread: it marks both ended and shuts the socket down.
    fn abort_handle_for(&self, fd: std::os::fd::BorrowedFd<'_>) -> Option<AbortHandle> {
        let fd = fd.try_clone_to_owned().ok()?;
        Some(AbortHandle::new(Arc::new(StreamAbort {
            ended: Arc::clone(&self.ended),
            fd,
        })))
    }
}

/// Ends a stream-socket flow: marks its halves ended, so a call that wakes
/// from a wait slice fails at once, and shuts the socket down in both
/// directions, so the kernel wakes a blocked call now and the peer sees the
/// end.
struct StreamAbort {
    ended: Arc<AtomicBool>,
    fd: std::os::fd::OwnedFd,
}

impl Abort for StreamAbort {
    fn abort(&self) {
        use std::os::fd::AsRawFd;
        self.ended.store(true, Ordering::Release);
        let _ = nix::sys::socket::shutdown(self.fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

/// A stream-socket flow: two handles on one socket, one per direction.
pub(crate) struct StreamFlow<S> {
    tx: Half<S>,
    rx: Half<S>,
}

/// The socket calls a [`StreamFlow`] needs.
pub(crate) trait StreamSocket: Read + Write + Send + Sized + std::os::fd::AsFd {
    /// Another handle on the same socket.
    fn duplicate(&self) -> io::Result<Self>;
    /// O_NONBLOCK on or off.
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    /// SO_RCVTIMEO.
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// SO_SNDTIMEO.
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Bytes queued for reading (FIONREAD).
    fn queued_bytes(&self) -> io::Result<usize>;
    /// One send that never blocks (MSG_DONTWAIT), whatever the socket's
    /// O_NONBLOCK says.
    fn send_nowait(&self, buf: &[u8]) -> io::Result<usize>;
    /// Waits until the socket has room to send, at most `timeout`; `false`
    /// when the time passed first.
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool>;
}

macro_rules! stream_socket {
    ($t:ty) => {
        impl StreamSocket for $t {
            fn duplicate(&self) -> io::Result<Self> {
                self.try_clone()
            }
            fn set_nonblocking(&self, on: bool) -> io::Result<()> {
                <$t>::set_nonblocking(self, on)
            }
            fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                <$t>::set_read_timeout(self, t)
            }
            fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                <$t>::set_write_timeout(self, t)
            }
            fn queued_bytes(&self) -> io::Result<usize> {
                queued_bytes(std::os::fd::AsRawFd::as_raw_fd(self))
            }
            fn send_nowait(&self, buf: &[u8]) -> io::Result<usize> {
                SockRef::from(self).send_with_flags(buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            }
            fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
                wait_writable(std::os::fd::AsFd::as_fd(self), timeout)
            }
        }
    };
}
/// FIONREAD on a stream socket: bytes in its receive queue.
fn queued_bytes(fd: std::os::fd::RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points to
    // a live local; `fd` is open for as long as the socket that lent it.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// poll(2) for POLLOUT on `fd` for at most `timeout` (rounded up to a
/// millisecond, so a remainder below one still waits).
fn wait_writable(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = u16::try_from(timeout.as_millis() + 1).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

stream_socket!(std::net::TcpStream);
stream_socket!(std::os::unix::net::UnixStream);

impl<S: StreamSocket> StreamFlow<S> {
    /// The two halves, for wrappers that add per-message work.
    pub(crate) fn into_parts(self) -> (Half<S>, Half<S>) {
        (self.tx, self.rx)
    }

    /// Wraps a connected socket, applying the mode and the timeout.
    pub(crate) fn new(socket: S, mode: Mode, timeout: Duration) -> io::Result<StreamFlow<S>> {
        match mode {
            Mode::Event => {
                socket.set_nonblocking(false)?;
                // Each blocking read lasts one slice; the receiving half
                // counts the slices against the whole timeout. Sends never
                // block in the kernel here ([`Half::send_event`]); the send
                // timeout is for flows that send on the socket themselves
                // (zero-copy).
                socket.set_read_timeout(Some(wait_slice(timeout)))?;
                socket.set_write_timeout(Some(timeout))?;
            }
            Mode::Poll => socket.set_nonblocking(true)?,
        }
        let rx = socket.duplicate()?;
        let ended = Arc::new(AtomicBool::new(false));
        Ok(StreamFlow {
            tx: Half {
                socket,
                mode,
                timeout,
                ended: Arc::clone(&ended),
                stall: None,
            },
            rx: Half {
                socket: rx,
                mode,
                timeout,
                ended,
                stall: None,
            },
        })
    }
}

impl<S: StreamSocket> Half<S> {
    /// The socket under this half.
    pub(crate) fn socket(&self) -> &S {
        &self.socket
    }

    /// Runs `op` until it moves at least one byte, per the mode.
    #[inline]
    fn progress(
        &mut self,
        mut op: impl FnMut(&mut S) -> io::Result<usize>,
    ) -> Result<usize, FlowError> {
        match self.mode {
            Mode::Event => {
                // One deadline for the call, from its start: each blocking
                // read lasts at most a slice (SO_RCVTIMEO), after which the
                // deadline and the flow's end are checked.
                let deadline = Instant::now() + self.timeout;
                loop {
                    self.check_ended()?;
                    match op(&mut self.socket) {
                        Ok(0) => return Err(self.check_ended().err().unwrap_or(FlowError::Closed)),
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e)
                            if e.kind() == io::ErrorKind::WouldBlock
                                || e.kind() == io::ErrorKind::TimedOut =>
                        {
                            if Instant::now() >= deadline {
                                return Err(FlowError::TimedOut {
                                    timeout_ms: self.timeout.as_millis(),
                                });
                            }
                        }
                        Err(e) => {
                            self.check_ended()?;
                            return Err(FlowError::from_io(e, self.timeout));
                        }
                    }
                }
            }
            Mode::Poll => {
                let mut deadline: Option<Instant> = None;
                let mut spins = 0u32;
                loop {
                    match op(&mut self.socket) {
                        Ok(0) => return Err(FlowError::Closed),
                        Ok(n) => return Ok(n),
                        Err(e)
                            if e.kind() == io::ErrorKind::WouldBlock
                                || e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FlowError::from_io(e, self.timeout)),
                    }
                    spins += 1;
                    if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                        self.check_ended()?;
                        let now = Instant::now();
                        match deadline {
                            None => deadline = Some(now + self.timeout),
                            Some(d) if now >= d => {
                                return Err(FlowError::TimedOut {
                                    timeout_ms: self.timeout.as_millis(),
                                })
                            }
                            Some(_) => {}
                        }
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }
}

impl<S: StreamSocket> Half<S> {
    /// An event-mode send: a non-blocking send, and while the socket is
    /// full, sleeps in poll() for room, each at most a slice of the
    /// timeout, until `timeout` passes with no useful progress. A blocking
    /// send under SO_SNDTIMEO would copy what fits, wait, and return that
    /// partial count at its timeout, so a stopped peer would cost one
    /// timeout per partial send before the error.
    ///
    /// Useful progress is sends that find room within a slice of asking,
    /// for a slice. One that moves bytes only after a longer wait (a
    /// stopped peer's kernel taking a last few) returns them but does not
    /// restart the clock, nor do the prompt sends that catch the rest of
    /// the same trickle: the next send of the same burst counts from the
    /// start of the first long wait ([`SendStall`]). A burst is sends that follow each
    /// other within a slice; a send after a longer pause (the test waiting
    /// for its peer's answer) starts a clock of its own.
    fn send_event(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let slice = wait_slice(self.timeout);
        let carried = self.carried_stall();
        let mut waiting_since: Option<Instant> = None;
        loop {
            self.check_ended()?;
            match self.socket.send_nowait(buf) {
                Ok(0) => return Err(FlowError::Closed),
                Ok(n) => {
                    self.note_send(waiting_since, carried);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    self.check_ended()?;
                    return Err(FlowError::from_io(e, self.timeout));
                }
            }
            let now = Instant::now();
            let waited_from = *waiting_since.get_or_insert(now);
            let deadline = carried.map_or(waited_from, |c| c.since) + self.timeout;
            if now >= deadline {
                return Err(FlowError::TimedOut {
                    timeout_ms: self.timeout.as_millis(),
                });
            }
            self.socket
                .wait_writable((deadline - now).min(slice))
                .map_err(|e| FlowError::from_io(e, self.timeout))?;
        }
    }
}

impl<S> Half<S> {
    /// The stall of the burst this send belongs to: the previous send
    /// returned a moment ago, and some send of the burst waited long less
    /// than a slice ago. Takes the stall; [`Half::note_send`] puts it back.
    #[inline]
    fn carried_stall(&mut self) -> Option<SendStall> {
        let stall = self.stall.take()?;
        let slice = wait_slice(self.timeout);
        (stall.last_returned.elapsed() < slice && stall.last_late.elapsed() < slice)
            .then_some(stall)
    }

    /// After a send moved bytes: if it first waited for room since
    /// `waiting_since` for a slice or more, the burst's stall goes on (from
    /// `carried`, the stall it continued, if any) or begins; a prompt send
    /// carries the stall it continued on unchanged but for its return time.
    #[inline]
    fn note_send(&mut self, waiting_since: Option<Instant>, carried: Option<SendStall>) {
        let now = Instant::now();
        let late = waiting_since.filter(|w| now.duration_since(*w) >= wait_slice(self.timeout));
        self.stall = match (late, carried) {
            (Some(w), carried) => Some(SendStall {
                since: carried.map_or(w, |c| c.since),
                last_late: now,
                last_returned: now,
            }),
            (None, Some(c)) => Some(SendStall {
                last_returned: now,
                ..c
            }),
            (None, None) => None,
        };
    }
}

impl<S: StreamSocket> Half<S> {
    /// A poll-mode send: non-blocking writes in a spin, with the deadline
    /// and the useful-progress rule of [`Half::send_event`], the clock read
    /// only every [`SPINS_PER_CLOCK_READ`] failed writes.
    fn send_poll(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let carried = self.carried_stall();
        let mut waiting_since: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            match self.socket.write(buf) {
                Ok(0) => return Err(FlowError::Closed),
                Ok(n) => {
                    self.note_send(waiting_since, carried);
                    return Ok(n);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.check_ended()?;
                    return Err(FlowError::from_io(e, self.timeout));
                }
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                self.check_ended()?;
                let now = Instant::now();
                let waited_from = *waiting_since.get_or_insert(now);
                if now >= carried.map_or(waited_from, |c| c.since) + self.timeout {
                    return Err(FlowError::TimedOut {
                        timeout_ms: self.timeout.as_millis(),
                    });
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl<S: StreamSocket> Sender for Half<S> {
    #[inline]
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        match self.mode {
            Mode::Event => self.send_event(buf),
            Mode::Poll => self.send_poll(buf),
        }
    }
}

impl<S: StreamSocket> Receiver for Half<S> {
    #[inline]
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        self.progress(|s| s.read(buf))
    }

    fn ready_bytes(&self) -> Option<u64> {
        self.socket.queued_bytes().ok().map(|n| n as u64)
    }
}

impl<S: StreamSocket + 'static> Flow for StreamFlow<S> {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn data_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.tx.socket.as_fd())
    }

    fn abort_handle(&self) -> Option<AbortHandle> {
        self.tx.abort_handle_for(self.tx.socket.as_fd())
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }
}

/// A TCP flow that corks each message (TCP_CORK set before its bytes,
/// cleared after them) and/or re-arms TCP_QUICKACK after every receive.
pub(crate) struct TcpHookFlow {
    tx: CorkSender,
    rx: QuickAckReceiver,
}

/// Sending half of a [`TcpHookFlow`].
pub(crate) struct CorkSender {
    inner: Half<std::net::TcpStream>,
    cork: bool,
}

/// Receiving half of a [`TcpHookFlow`].
pub(crate) struct QuickAckReceiver {
    inner: Half<std::net::TcpStream>,
    quickack: bool,
}

fn option_failed(e: io::Error) -> FlowError {
    FlowError::Io(e)
}

impl Sender for CorkSender {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        self.inner.send_some(buf)
    }

    fn send_all(&mut self, mut buf: &[u8]) -> Result<(), FlowError> {
        if self.cork {
            set_cork(self.inner.socket(), true).map_err(option_failed)?;
        }
        while !buf.is_empty() {
            let n = self.inner.send_some(buf)?;
            buf = &buf[n..];
        }
        if self.cork {
            set_cork(self.inner.socket(), false).map_err(option_failed)?;
        }
        Ok(())
    }
}

impl Receiver for QuickAckReceiver {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        let n = self.inner.recv_some(buf)?;
        if self.quickack {
            set_quickack(self.inner.socket()).map_err(option_failed)?;
        }
        Ok(n)
    }

    fn ready_bytes(&self) -> Option<u64> {
        self.inner.ready_bytes()
    }
}

impl StreamFlow<std::net::TcpStream> {
    /// Wraps the flow to cork each message and/or re-arm quick ACKs.
    pub(crate) fn with_tcp_hooks(self, quickack: bool, cork: bool) -> TcpHookFlow {
        TcpHookFlow {
            tx: CorkSender {
                inner: self.tx,
                cork,
            },
            rx: QuickAckReceiver {
                inner: self.rx,
                quickack,
            },
        }
    }
}

impl Flow for TcpHookFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn data_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self.tx.inner.socket()))
    }

    fn abort_handle(&self) -> Option<AbortHandle> {
        self.tx
            .inner
            .abort_handle_for(std::os::fd::AsFd::as_fd(self.tx.inner.socket()))
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }
}

/// Sets TCP_CORK on or off; used around each message with `--cork`.
fn set_cork(stream: &std::net::TcpStream, on: bool) -> std::io::Result<()> {
    SockRef::from(stream).set_cork(on)
}

/// Re-arms TCP_QUICKACK; used after each receive with `--quickack`.
fn set_quickack(stream: &std::net::TcpStream) -> std::io::Result<()> {
    SockRef::from(stream).set_quickack(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn an_abort_ends_both_halves_blocked_calls_at_once() {
        // A receive and a send, each blocked on a silent peer with a long
        // timeout, both fail soon after the flow is ended from a third
        // thread.
        let (ours, peer) = UnixStream::pair().expect("pair");
        let timeout = Duration::from_secs(20);
        let flow = StreamFlow::new(ours, Mode::Event, timeout).expect("flow");
        let abort = flow.abort_handle().expect("abort handle");
        let (mut tx, mut rx) = flow.into_parts();
        let t0 = Instant::now();
        let receiving = std::thread::spawn(move || rx.recv_some(&mut [0u8; 64]));
        let sending = std::thread::spawn(move || {
            let buf = vec![0u8; 1 << 16];
            loop {
                if let Err(e) = tx.send_some(&buf) {
                    return e;
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        abort.abort();
        let received = receiving.join().expect("join");
        let sent = sending.join().expect("join");
        let took = t0.elapsed();
        drop(peer);
        assert!(received.is_err(), "{received:?}");
        assert!(!matches!(sent, FlowError::TimedOut { .. }), "{sent:?}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
    }

    #[test]
    fn a_receive_in_slices_still_names_one_whole_timeout() {
        let (ours, _peer) = UnixStream::pair().expect("pair");
        let timeout = Duration::from_millis(400);
        let flow = StreamFlow::new(ours, Mode::Event, timeout).expect("flow");
        let (_, mut rx) = flow.into_parts();
        let t0 = Instant::now();
        let r = rx.recv_some(&mut [0u8; 64]);
        let took = t0.elapsed();
        assert!(
            matches!(r, Err(FlowError::TimedOut { timeout_ms: 400 })),
            "{r:?}"
        );
        assert!(took >= timeout, "took {took:?}");
    }

    /// A peer that takes at most 128 KiB every `every`, for
    /// `for_how_long`: the trickle a stopped peer's kernel gives. Over a
    /// Unix socket the room it makes shows to a send at once but not to
    /// poll() (which waits for three quarters of the buffer to be free), so
    /// a waiting send finds it at its next slice.
    fn trickling_peer(
        peer: UnixStream,
        every: Duration,
        for_how_long: Duration,
    ) -> std::thread::JoinHandle<()> {
        trickling_peer_in_pieces(peer, every, for_how_long, 1)
    }

    /// [`trickling_peer`] taking each 128 KiB in `pieces` reads a few
    /// milliseconds apart, so the room of one trickle shows to the sender
    /// more than once.
    fn trickling_peer_in_pieces(
        mut peer: UnixStream,
        every: Duration,
        for_how_long: Duration,
        pieces: usize,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            peer.set_nonblocking(true).expect("nonblocking");
            let t0 = Instant::now();
            let mut buf = vec![0u8; (128 << 10) / pieces];
            while t0.elapsed() < for_how_long {
                std::thread::sleep(every);
                for piece in 0..pieces {
                    if piece > 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if let Ok(0) = peer.read(&mut buf) {
                        return;
                    }
                }
            }
        })
    }

    #[test]
    fn sends_that_find_room_only_late_do_not_restart_the_clock() {
        for mode in [Mode::Event, Mode::Poll] {
            sends_that_find_room_only_late_time_out(mode);
        }
    }

    #[test]
    fn the_prompt_sends_that_catch_the_rest_of_a_trickle_do_not_restart_the_clock() {
        // Each trickle comes in two reads 5 ms apart: the second send of
        // each finds room promptly, yet is still the same late trickle.
        for mode in [Mode::Event, Mode::Poll] {
            sends_that_find_room_only_late_time_out_with(mode, 2);
        }
    }

    fn sends_that_find_room_only_late_time_out(mode: Mode) {
        sends_that_find_room_only_late_time_out_with(mode, 1);
    }

    fn sends_that_find_room_only_late_time_out_with(mode: Mode, pieces: usize) {
        // Room comes every 400 ms, more than a slice (250 ms) of the 1 s
        // timeout: the burst is named silent about one timeout after its
        // first long wait, not kept alive for as long as the trickle lasts.
        let (ours, peer) = UnixStream::pair().expect("pair");
        let trickle = trickling_peer_in_pieces(
            peer,
            Duration::from_millis(400),
            Duration::from_secs(6),
            pieces,
        );
        let timeout = Duration::from_secs(1);
        let (mut tx, _rx) = StreamFlow::new(ours, mode, timeout)
            .expect("flow")
            .into_parts();
        // Larger than what one trickle frees: each late send takes all the
        // room there is, and the next waits again.
        let buf = vec![0u8; 4 << 20];
        let t0 = Instant::now();
        let result = loop {
            if let Err(e) = tx.send_some(&buf) {
                break e;
            }
        };
        let took = t0.elapsed();
        drop(tx);
        trickle.join().expect("join");
        assert!(
            matches!(result, FlowError::TimedOut { timeout_ms: 1000 }),
            "{mode:?} in {pieces}: {result:?}"
        );
        assert!(
            took < Duration::from_secs(4),
            "{mode:?} in {pieces}: took {took:?}"
        );
    }

    #[test]
    fn a_burst_after_a_pause_starts_a_clock_of_its_own() {
        // Bursts that each end in a long wait (room every 300 ms, found at
        // most a slice later), with pauses longer than a slice between
        // them, never time out while each finds room within the timeout.
        let (ours, peer) = UnixStream::pair().expect("pair");
        let trickle = trickling_peer(peer, Duration::from_millis(300), Duration::from_secs(4));
        let timeout = Duration::from_secs(1);
        let (mut tx, _rx) = StreamFlow::new(ours, Mode::Event, timeout)
            .expect("flow")
            .into_parts();
        let buf = vec![0u8; 1 << 16];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(2500) {
            // Fill until a send has to wait, then pause.
            let filled = Instant::now();
            loop {
                tx.send_some(&buf)
                    .expect("the peer takes bytes within the timeout");
                if filled.elapsed() > Duration::from_millis(100) {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        drop(tx);
        trickle.join().expect("join");
    }
}
