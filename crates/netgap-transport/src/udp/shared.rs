//! The flow's shared state at work: sending, receiving and reassembling
//! its messages, acknowledging and resending, and the counters.

use super::*;

impl Shared {
    pub(super) fn new(socket: UdpSocket, config: &FlowConfig) -> io::Result<Shared> {
        let layout = BufferLayout::of_options(&config.options)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        match config.mode {
            Mode::Event => {
                socket.set_nonblocking(false)?;
                socket.set_write_timeout(Some(config.io_timeout))?;
            }
            Mode::Poll => socket.set_nonblocking(true)?,
        }
        Ok(Shared {
            socket,
            mode: config.mode,
            io_timeout: config.io_timeout,
            tx: Mutex::new(TxState {
                seq: Sending::new(),
                last: AlignedBuffer::zeroed(HEADER_BYTES + MAX_MESSAGE_BYTES, layout),
                last_bytes: 0,
                silence: SilenceWatch::new(config.io_timeout),
            }),
            rx: Mutex::new(RxState {
                recv: Receiving::new(),
                hdr: [0u8; HEADER_BYTES],
                overflow: AlignedBuffer::zeroed(OVERFLOW_BYTES, layout),
                pending: 0..0,
                rto: RetryTimeout::new(Hysteresis::Quarter),
                rcv_timeout: None,
                acks: AckPacer::new(config.io_timeout),
            }),
            counters: Counters::default(),
            heard: AtomicU64::new(0),
            probe_seq: AtomicU64::new(u64::MAX),
            aborted: AtomicBool::new(false),
            #[cfg(test)]
            drop_seq: AtomicU64::new(u64::MAX),
        })
    }

    /// Ends the flow from another thread: raises the abort flag and shuts
    /// the socket down, which wakes a receive blocked on it (it returns
    /// nothing, and the loop then sees the flag).
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        let _ = SockRef::from(&self.socket).shutdown(std::net::Shutdown::Both);
    }

    /// Fails once the flow was ended by its [`crate::AbortHandle`].
    #[inline]
    pub(super) fn check_aborted(&self) -> Result<(), FlowError> {
        if self.aborted.load(Ordering::Relaxed) {
            return Err(crate::aborted());
        }
        Ok(())
    }

    /// Sends `payload` as the next data datagram; fails once this end has
    /// sent for the whole inactivity timeout without a word from the peer
    /// (see [`Shared::peer_silent`]).
    pub(super) fn send_data(&self, payload: &[u8]) -> Result<(), FlowError> {
        self.check_aborted()?;
        if payload.len() > MAX_MESSAGE_BYTES {
            return Err(FlowError::TooLarge {
                size_bytes: payload.len() as u64,
                max_bytes: MAX_MESSAGE_BYTES as u64,
            });
        }
        if self.peer_silent() {
            return Err(FlowError::TimedOut {
                timeout_ms: self.io_timeout.as_millis(),
            });
        }
        let mut tx = lock(&self.tx);
        let header = tx.seq.data_header();
        let n = HEADER_BYTES + payload.len();
        tx.last[..HEADER_BYTES].copy_from_slice(&header.encode());
        tx.last[HEADER_BYTES..n].copy_from_slice(payload);
        tx.last_bytes = n;
        #[cfg(test)]
        let dropped = self
            .drop_seq
            .compare_exchange(header.seq, u64::MAX, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        #[cfg(not(test))]
        let dropped = false;
        if !dropped {
            self.send_datagram(&tx.last[..n])?;
        }
        tx.seq.sent(payload.len());
        bump(&self.counters.sent, 1);
        Ok(())
    }

    /// Whether the peer has said nothing for the whole inactivity timeout
    /// while this end kept sending ([`SilenceWatch`]): a sender that
    /// receives nothing (a one-way stream) reads now and then what the
    /// peer sent, without waiting, to hear its acknowledgments.
    pub(super) fn peer_silent(&self) -> bool {
        let now = Instant::now();
        let heard = self.heard.load(Ordering::Relaxed);
        let check = lock(&self.tx).silence.before_send(now, heard);
        let SendCheck::Listen { quiet } = check else {
            return false;
        };
        self.listen_while_sending();
        let heard = self.heard.load(Ordering::Relaxed);
        lock(&self.tx).silence.after_listen(now, heard, quiet)
    }

    /// Reads, without waiting, what the peer sent that is not new data
    /// (acknowledgments, probes, NACKs, duplicates), so a sending end
    /// hears from the peer though no thread receives. New data stays
    /// queued for the receiving half; so does everything while a receive
    /// is under way, which hears the peer itself.
    pub(super) fn listen_while_sending(&self) {
        let Some(mut guard) = try_lock(&self.rx) else {
            return;
        };
        let rx = &mut *guard;
        for _ in 0..LISTEN_BATCH {
            let peeked = nix::sys::socket::recv(
                self.socket.as_raw_fd(),
                &mut rx.hdr,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            );
            let Ok(n) = peeked else {
                return;
            };
            if Header::decode(&rx.hdr[..n]).is_ok_and(|h| rx.recv.is_new_data(&h)) {
                return;
            }
            // What is left is header-only or old: its header (and the
            // datagram's whole length) is all the accounting needs.
            let got = nix::sys::socket::recv(
                self.socket.as_raw_fd(),
                &mut rx.hdr,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
            );
            match got {
                Ok(total) => {
                    if self.arrive(rx, total).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// Sends one datagram, blocking or spinning per the mode until the
    /// inactivity timeout.
    pub(super) fn send_datagram(&self, datagram: &[u8]) -> Result<(), FlowError> {
        let mut deadline: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            match self.socket.send(datagram) {
                Ok(n) if n == datagram.len() => return Ok(()),
                Ok(n) => {
                    return Err(FlowError::Io(io::Error::other(format!(
                        "the kernel sent {n} of a {}-byte datagram",
                        datagram.len()
                    ))))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.mode == Mode::Event => {
                    return Err(FlowError::TimedOut {
                        timeout_ms: self.io_timeout.as_millis(),
                    })
                }
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(flow_err(e, self.io_timeout)),
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) {
                let now = Instant::now();
                match deadline {
                    None => deadline = Some(now + self.io_timeout),
                    Some(d) if now >= d => {
                        return Err(FlowError::TimedOut {
                            timeout_ms: self.io_timeout.as_millis(),
                        })
                    }
                    Some(_) => {}
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// Re-sends the last data datagram without blocking, flagged RETRY when
    /// this end is the one waiting, if its sequence number is `from_seq` or
    /// later. Best effort: skipped while the sending half is busy (it is
    /// sending anyway) or before anything was sent.
    pub(super) fn resend(&self, retry: bool, from_seq: u64) {
        let Some(mut tx) = try_lock(&self.tx) else {
            return;
        };
        let n = tx.last_bytes;
        if n < HEADER_BYTES || !tx.seq.resends(from_seq) {
            return;
        }
        tx.last[wire::FLAGS_AT] = if retry { FLAG_RETRY } else { 0 };
        let sent = nix::sys::socket::send(
            self.socket.as_raw_fd(),
            &tx.last[..n],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
        tx.last[wire::FLAGS_AT] = 0;
        if sent.is_ok() {
            bump(&self.counters.sent, 1);
            bump(&self.counters.retries, 1);
        }
    }

    /// Sends a header-only datagram without blocking, best effort.
    pub(super) fn send_control(&self, header: Header) {
        let _ = nix::sys::socket::send(
            self.socket.as_raw_fd(),
            &header.encode(),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        );
    }

    /// Tells the peer where this end's burst ended, so a lost tail is asked
    /// for at once instead of after a retry timeout; receives re-send the
    /// probe while they wait (the first may be dropped by the same full
    /// queue that dropped the tail).
    pub(super) fn end_burst(&self) {
        let tx = lock(&self.tx);
        if let Some(probe) = tx.seq.probe() {
            self.probe_seq.store(probe.seq, Ordering::Relaxed);
            self.send_control(probe);
        }
    }

    /// Sends the probe of the latest burst again; false once there is none
    /// (or more data followed it).
    pub(super) fn reprobe(&self) -> bool {
        let seq = self.probe_seq.load(Ordering::Relaxed);
        if seq == u64::MAX {
            return false;
        }
        let Some(tx) = try_lock(&self.tx) else {
            return true;
        };
        if !tx.seq.still_ends_at(seq) {
            self.probe_seq.store(u64::MAX, Ordering::Relaxed);
            return false;
        }
        if let Some(probe) = tx.seq.probe() {
            self.send_control(probe);
        }
        true
    }

    /// Waits until the socket is readable or `t` passes: true if readable.
    pub(super) fn readable_within(&self, t: Duration) -> Result<bool, FlowError> {
        use nix::poll::{ppoll, PollFd, PollFlags};
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        match ppoll(&mut fds, Some(TimeSpec::from_duration(t)), None) {
            Ok(n) => Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(FlowError::Io(e.into())),
        }
    }

    /// Accounts for a datagram of `total` bytes whose header is in
    /// `rx.hdr` ([`Receiving::on_datagram`]) and sends what it answers.
    pub(super) fn arrive(&self, rx: &mut RxState, total: usize) -> Result<Arrival, FlowError> {
        let Ok(h) = Header::decode(&rx.hdr[..total.min(HEADER_BYTES)]) else {
            return Ok(Arrival::Nothing);
        };
        self.heard.fetch_add(1, Ordering::Relaxed);
        if h.kind == Kind::Data {
            bump(&self.counters.received, 1);
        }
        let a = rx
            .recv
            .on_datagram(&h, total - HEADER_BYTES)
            .map_err(|e| protocol_err(e.to_string()))?;
        let t = a.tally;
        for (c, by) in [
            (&self.counters.lost, t.lost),
            (&self.counters.lost_bytes, t.lost_bytes),
            (&self.counters.reordered, t.reordered),
            (&self.counters.duplicates, t.duplicates),
        ] {
            if by > 0 {
                bump(c, by);
            }
        }
        match a.answer {
            Answer::None => {}
            Answer::Control(header) => self.send_control(header),
            Answer::Resend { from_seq } => self.resend(false, from_seq),
        }
        Ok(match a.deliver_bytes {
            0 => Arrival::Nothing,
            len => Arrival::Data(len),
        })
    }

    /// Tells the peer this end is receiving, if a quarter of the
    /// inactivity timeout has passed since it last did (see
    /// [`Shared::peer_silent`]).
    pub(super) fn ack_if_due(&self, rx: &mut RxState) {
        if rx.acks.due(Instant::now()) {
            self.send_control(rx.recv.ack());
        }
    }

    /// Sets SO_RCVTIMEO to `t` unless it already is.
    pub(super) fn set_rcv_timeout(&self, rx: &mut RxState, t: Duration) -> Result<(), FlowError> {
        let t = t.max(Duration::from_micros(100));
        if rx.rcv_timeout != Some(t) {
            self.socket
                .set_read_timeout(Some(t))
                .map_err(FlowError::Io)?;
            rx.rcv_timeout = Some(t);
        }
        Ok(())
    }

    /// Receives at least one new payload byte into `buf` (non-empty).
    pub(super) fn recv(&self, buf: &mut [u8]) -> Result<usize, FlowError> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.check_aborted()?;
        let mut guard = lock(&self.rx);
        let rx = &mut *guard;
        if !rx.pending.is_empty() {
            let n = rx.pending.len().min(buf.len());
            let from = rx.pending.start;
            buf[..n].copy_from_slice(&rx.overflow[from..from + n]);
            rx.pending.start += n;
            return Ok(n);
        }
        let probing = self.probe_seq.load(Ordering::Relaxed) != u64::MAX;
        let mut waiting = RecvWait::new(Instant::now(), self.io_timeout, rx.rto.get(), probing);
        let mut spins = 0u32;
        loop {
            let mut readable = true;
            if self.mode == Mode::Event {
                match waiting.wake_at() {
                    // Probes are due sooner than SO_RCVTIMEO's tick allows.
                    Some(until) => {
                        readable =
                            self.readable_within(until.saturating_duration_since(Instant::now()))?;
                    }
                    None => self.set_rcv_timeout(rx, waiting.wait())?,
                }
            }
            let got = if readable {
                let mut iov = [
                    IoSliceMut::new(&mut rx.hdr),
                    IoSliceMut::new(&mut *buf),
                    IoSliceMut::new(&mut rx.overflow),
                ];
                nix::sys::uio::readv(&self.socket, &mut iov).map_err(io::Error::from)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
            let check_clock = match got {
                Ok(total) => match self.arrive(rx, total)? {
                    Arrival::Data(len) => {
                        waiting.delivered(Instant::now(), &mut rx.rto);
                        if len > buf.len() {
                            rx.pending = 0..len - buf.len();
                        }
                        self.ack_if_due(rx);
                        return Ok(len.min(buf.len()));
                    }
                    Arrival::Nothing => true,
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.mode == Mode::Event {
                        true
                    } else {
                        spins += 1;
                        std::hint::spin_loop();
                        spins.is_multiple_of(SPINS_PER_CLOCK_READ)
                    }
                }
                Err(e) => return Err(flow_err(e, self.io_timeout)),
            };
            if !check_clock {
                continue;
            }
            self.check_aborted()?;
            let now = Instant::now();
            match waiting.tick(now) {
                Tick::TimedOut => {
                    return Err(FlowError::TimedOut {
                        timeout_ms: self.io_timeout.as_millis(),
                    })
                }
                Tick::Wait { retry, probe } => {
                    if retry {
                        self.resend(true, 0);
                    }
                    if probe {
                        let still = self.reprobe();
                        waiting.probed(now, still, rx.rto.get());
                    }
                }
            }
        }
    }

    /// Answers the peer's retries until `wake` is readable or `max_wait`
    /// passes, leaving new data queued for the next receive.
    pub(super) fn idle(&self, wake: BorrowedFd<'_>, max_wait: Duration) -> Result<(), FlowError> {
        use nix::poll::{ppoll, PollFd, PollFlags};
        let start = Instant::now();
        let deadline = start + max_wait;
        let Some(mut guard) = try_lock(&self.rx) else {
            return Ok(());
        };
        let rx = &mut *guard;
        // With undelivered bytes or new data queued, the test is about to
        // run again: only the wake-up is worth waiting for.
        let mut watch_data = rx.pending.is_empty();
        // The peer may still wait for the tail of this end's last burst.
        let mut probes = ProbeTimer::new(start, self.probe_seq.load(Ordering::Relaxed) != u64::MAX);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            if probes.due(now) {
                let still = self.reprobe();
                probes.probed(now, still, rx.rto.get());
            }
            let until = probes.at().map_or(deadline, |at| at.min(deadline));
            let mut fds = [
                PollFd::new(wake, PollFlags::POLLIN),
                PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
            ];
            let watched = if watch_data { 2 } else { 1 };
            let left = TimeSpec::from_duration(until.saturating_duration_since(now));
            match ppoll(&mut fds[..watched], Some(left), None) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(FlowError::Io(e.into())),
            }
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                return Ok(());
            }
            if !watch_data || fds[1].revents().is_none_or(|r| r.is_empty()) {
                continue;
            }
            let peeked = nix::sys::socket::recv(
                self.socket.as_raw_fd(),
                &mut rx.hdr,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            );
            let n = match peeked {
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(flow_err(e.into(), self.io_timeout)),
            };
            if Header::decode(&rx.hdr[..n]).is_ok_and(|h| rx.recv.is_new_data(&h)) {
                watch_data = false;
                continue;
            }
            let got = {
                let mut iov = [
                    IoSliceMut::new(&mut rx.hdr),
                    IoSliceMut::new(&mut rx.overflow),
                ];
                nix::sys::uio::readv(&self.socket, &mut iov).map_err(io::Error::from)
            };
            match got {
                Ok(total) => {
                    self.arrive(rx, total)?;
                }
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(flow_err(e, self.io_timeout)),
            }
        }
    }
}
