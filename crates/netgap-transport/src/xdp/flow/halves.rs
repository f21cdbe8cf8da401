//! The flow's side of its session: the state its two halves and its
//! monitor share, the halves the tests send and receive through, and the
//! flow that owns them.

use super::*;

/// One flow: a session on a port, shared by the flow's two halves and its
/// monitor.
pub(crate) struct Shared {
    port: Arc<Port>,
    id: u16,
    signal: Arc<Signal>,
    mode: Mode,
    timeout: Duration,
    /// The session's counters as it closed, for a monitor that outlives
    /// the flow (a workload role totals its flows' after they closed).
    closed: Arc<Mutex<Option<DatagramStats>>>,
}

impl Shared {
    /// The flow of session `id` on `port`, of `mode`, with inactivity
    /// timeout `timeout`.
    pub(crate) fn new(
        port: Arc<Port>,
        id: u16,
        mode: Mode,
        timeout: Duration,
    ) -> Result<Arc<Shared>, FlowError> {
        let signal = {
            let mut st = port.lock();
            let (_, s) = st.session(id)?;
            Arc::clone(&s.signal)
        };
        Ok(Arc::new(Shared {
            port,
            id,
            signal,
            mode,
            timeout,
            closed: Arc::new(Mutex::new(None)),
        }))
    }

    /// The session's counters now, with the port's drops.
    fn stats(&self) -> Option<DatagramStats> {
        let mut st = self.port.lock();
        let dropped = st.dropped_frames();
        st.session(self.id)
            .ok()
            .map(|(_, s)| DatagramStats { dropped, ..s.stats })
    }

    /// Runs `attempt` (under the port's lock, after a pump) until it
    /// returns `Some`, waiting as the mode says; fails after `timeout`
    /// without progress.
    pub(crate) fn wait_for<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut(&mut PortIo, &mut Session) -> Result<Option<T>, FlowError>,
    ) -> Result<T, FlowError> {
        // The deadline is on the port's clock as its pumps read it (every
        // few spins), so waiting adds no clock read of its own.
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut deadline_ns: Option<u64> = None;
        // Poll mode: when this wait started spinning, or last yielded, on
        // the port's clock.
        let mut spin_since_ns: Option<u64> = None;
        let mut first = true;
        let mut first_pump = true;
        let mut seen_arrivals = 0u64;
        loop {
            self.port.kick_error()?;
            // The first try goes before any pump, and before the rest of a
            // receive's pump left for later: a send that has credit, or a
            // receive whose bytes are here, needs neither.
            let mut st = if first {
                self.port.lock_deferred()
            } else {
                self.port.lock()
            };
            if first {
                first = false;
                let (io, s) = st.session(self.id)?;
                seen_arrivals = s.arrivals;
                if let Some(v) = attempt(io, s)? {
                    return Ok(v);
                }
            }
            // A fresh clock for every event-mode wake-up and a wait's first
            // pump; a poll-mode spin after it uses a recent pump's.
            let fresh = self.mode == Mode::Event || std::mem::take(&mut first_pump);
            match self.mode {
                Mode::Poll => st.pump_for(self.id, fresh),
                Mode::Event => st.pump(fresh),
            }
            let (io, s) = st.session(self.id)?;
            if let Some(v) = attempt(io, s)? {
                return Ok(v);
            }
            if s.arrivals != seen_arrivals {
                seen_arrivals = s.arrivals;
                deadline_ns = None;
            }
            let now_ns = io.now_cache_ns;
            let clock_read = io.clock_read;
            let dl = match deadline_ns {
                Some(dl) => dl,
                None if io.clock_read => *deadline_ns.insert(now_ns.saturating_add(timeout_ns)),
                // Not started yet: spin on until a pump reads the clock.
                None => u64::MAX,
            };
            if now_ns >= dl {
                return Err(FlowError::TimedOut {
                    timeout_ms: timeout.as_millis(),
                });
            }
            match self.mode {
                // No pause instruction between spins (as the C floor has
                // none): under KVM a loop of pauses can exit to the
                // hypervisor (pause-loop exiting), and each pause delays
                // seeing the frame.
                Mode::Poll => {
                    drop(st);
                    if clock_read {
                        let since = *spin_since_ns.get_or_insert(now_ns);
                        if now_ns.saturating_sub(since) >= YIELD_AFTER_NS {
                            spin_since_ns = None;
                            std::thread::yield_now();
                        }
                    }
                }
                // Frames still wait on the TX ring: ring again, not sleep,
                // but let the other threads of the port run first: with
                // several flows on one port, waiters that spun straight
                // back to its lock took the CPU from the ones that had
                // work (four streams from one host went from 4.2-4.8 to
                // 5.4-6.1 Gbit/s; one stream and the event-mode ping-pong
                // unchanged).
                Mode::Event if io.tx_backlog() => {
                    drop(st);
                    std::thread::yield_now();
                }
                Mode::Event => {
                    let sleep = s
                        .next_timer(now_ns)
                        .unwrap_or(MAX_SLEEP)
                        .min(MAX_SLEEP)
                        .min(Duration::from_nanos(dl - now_ns));
                    if s.poller {
                        s.cv_waiters += 1;
                        let (mut st, _) = self
                            .signal
                            .cv
                            .wait_timeout(st.into_inner(), sleep)
                            .unwrap_or_else(|e| e.into_inner());
                        if let Ok((_, s)) = st.session(self.id) {
                            s.cv_waiters -= 1;
                        }
                    } else {
                        s.poller = true;
                        drop(st);
                        self.sleep_in_poll(sleep);
                        if let Ok((_, s)) = self.port.lock().session(self.id) {
                            s.poller = false;
                        }
                    }
                }
            }
        }
    }

    /// Sleeps until a frame arrives, a pump rings this session, or `max`
    /// passes.
    fn sleep_in_poll(&self, max: Duration) {
        let ms = libc::c_int::try_from(max.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        let mut fds = [
            libc::pollfd {
                fd: self.port.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.signal.bell.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd structs.
        let _ = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if fds[1].revents != 0 {
            self.signal.drain();
        }
    }

    /// Pumps the port and reads this session's `f`.
    fn with<T>(&self, f: impl FnOnce(&mut PortIo, &mut Session) -> T) -> Result<T, FlowError> {
        self.port.kick_error()?;
        let mut st = self.port.lock();
        st.pump(true);
        let (io, s) = st.session(self.id)?;
        Ok(f(io, s))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Linger: let what is unacknowledged arrive, then say the stream
        // ended, so the peer's receive ends instead of timing out. The
        // port's lock is let go between pumps: its other flows go on.
        let t0 = Instant::now();
        while t0.elapsed() < LINGER {
            let done = self.with(|io, s| {
                if !s.connected() {
                    return true;
                }
                if !s.fin_sent {
                    s.send_fin(io);
                    false
                } else {
                    s.send.idle()
                }
            });
            if !matches!(done, Ok(false)) {
                break;
            }
            match self.mode {
                Mode::Poll => std::hint::spin_loop(),
                Mode::Event => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        if let Some(last) = self.stats() {
            *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
        }
        self.port.remove(self.id);
    }
}

/// One half of an xdp flow.
pub(crate) struct Half {
    shared: Arc<Shared>,
}

impl Sender for Half {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let timeout = self.shared.timeout;
        self.shared.wait_for(timeout, |io, s| {
            let n = s.send_some(io, buf)?;
            Ok((n > 0).then_some(n))
        })
    }
}

impl Receiver for Half {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        let timeout = self.shared.timeout;
        self.shared.wait_for(timeout, |io, s| {
            if s.recv.ready_bytes() > 0 {
                let n = s.recv.read(buf);
                // The time of the latest pump that read the clock (the
                // one that brought these bytes, or earlier): a delayed
                // acknowledgment judged a little early waits for the
                // next pump's timers, so no clock read is needed here.
                if s.recv.ack_due(io.now_cache_ns) {
                    // Reading opened room: tell a sender waiting for
                    // credit.
                    s.post(io, Kind::Ack, 0, &[], false);
                    io.flush();
                }
                return Ok(Some(n));
            }
            if s.recv.finished() {
                return Err(FlowError::Closed);
            }
            Ok(None)
        })
    }

    fn ready_bytes(&self) -> Option<u64> {
        self.shared.with(|_, s| s.recv.ready_bytes() as u64).ok()
    }
}

/// An open xdp flow.
pub(crate) struct XdpFlow {
    tx: Half,
    rx: Half,
    shared: Arc<Shared>,
}

impl XdpFlow {
    /// The flow over an open session.
    pub(crate) fn new(shared: Arc<Shared>) -> XdpFlow {
        XdpFlow {
            tx: Half {
                shared: Arc::clone(&shared),
            },
            rx: Half {
                shared: Arc::clone(&shared),
            },
            shared,
        }
    }
}

impl Flow for XdpFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }

    fn monitor(&self) -> Option<Arc<dyn FlowMonitor>> {
        Some(Arc::new(Monitor {
            shared: Arc::downgrade(&self.shared),
            closed: Arc::clone(&self.shared.closed),
            port: self.shared.port.fd,
        }))
    }

    /// Frames lost on the way are sent again: every byte arrives, in
    /// order, though the flow has datagram counts to report.
    fn reliable(&self) -> bool {
        true
    }

    fn path_choices(&self) -> Vec<String> {
        // Native and generic XDP are different paths through the kernel:
        // the generic hook runs after the socket buffer is built.
        vec![format!("xdp_attach={}", self.shared.port.attach.name())]
    }

    fn bind_session(&mut self, key: &FlowKey) -> Result<(), FlowError> {
        let mut st = self.shared.port.lock();
        let (io, s) = st.session(self.shared.id)?;
        let mac = io.local_mac;
        s.bind(mac, key)
    }
}

/// The counters and the idle upkeep of an xdp flow: its frames sent,
/// received and sent again, and acknowledgments and retransmissions while
/// the test is idle. Holds the flow weakly, so the flow still closes when
/// the test drops it.
struct Monitor {
    shared: Weak<Shared>,
    /// The counters the session left when it closed.
    closed: Arc<Mutex<Option<DatagramStats>>>,
    /// The port's socket: its drops are every flow's on the port.
    port: RawFd,
}

impl FlowMonitor for Monitor {
    fn datagram_stats(&self) -> DatagramStats {
        self.shared
            .upgrade()
            .and_then(|s| s.stats())
            .or_else(|| *self.closed.lock().unwrap_or_else(|e| e.into_inner()))
            .unwrap_or_default()
    }

    fn drops_scope(&self) -> Option<u64> {
        u64::try_from(self.port).ok()
    }

    fn serve_idle(&self, wake: BorrowedFd<'_>, max_wait: Duration) -> Result<(), FlowError> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        let t0 = Instant::now();
        loop {
            shared.port.pump()?;
            let left = max_wait.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Ok(());
            }
            let ms = libc::c_int::try_from(left.min(MAX_SLEEP).as_millis().max(1))
                .unwrap_or(libc::c_int::MAX);
            let mut fds = [
                libc::pollfd {
                    fd: wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: shared.port.fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a live array of two pollfd structs.
            let _ = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if fds[0].revents != 0 {
                return Ok(());
            }
        }
    }
}
