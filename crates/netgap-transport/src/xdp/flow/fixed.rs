//! Sessions whose flow ids were fixed before they opened: a direct
//! connection's ([`super::super::direct`]), one per port of its own, made
//! by the host's relay and handed to the program. The relays chose both
//! ends' ids and gave both programs the connection's key, so no listener
//! draws an id: the connector sends its opening from its id to the peer's,
//! the acceptor takes only the opening from exactly the peer's MAC and id
//! to its own, and every frame is sealed from the opening on. The
//! acceptor, once its buffers are the kernel's, sends the connector one
//! sealed probe, which has the connector send its opening again at once:
//! an opening that came before the acceptor was ready was dropped by its
//! kernel. The session is otherwise the one every xdp flow has (windows,
//! retransmission, credit, reassembly), driven by the application's own
//! calls: each call pumps the port once and never waits, so a full window
//! or an empty receive buffer is the caller's to wait out (on the port's
//! socket, for at most [`Port::fixed_state`]'s next timer).
//!
//! A peer that stops answering while this end waits on it (for the answer
//! to its opening, or for an acknowledgment of what it sent) is given up
//! after the session's silence limit: the engine retransmits with backoff
//! meanwhile, and afterwards every call fails with a timeout.
//!
//! A reset ends the connection at once, as a TCP RST does: this end sends
//! one when its program closes with bytes unread, when bytes arrive after
//! its close, or when its close cannot finish (the opening never came, or
//! what it sent is still unacknowledged when its linger ends); from then
//! on it takes nothing and answers every frame of the peer's with a reset
//! again (never a reset with one), so a peer whose first reset was lost
//! still learns. A reset from the peer (before the opening too: the
//! connector's opening may be what it answers) ends every call here with
//! [`FlowError::Closed`]. Both ends hold the connection's key before the
//! first frame, so a reset is sealed and verified like every frame: no
//! stranger can end the connection with one.

use super::*;

/// How long after its opening the connector sends it again if it is not
/// answered, ns, doubled at each try up to [`SYN_EVERY_NS`]. Short: the
/// relays hand the two ends their sockets at about the same moment, and
/// an opening that reaches the acceptor's before its program has given
/// the kernel buffers to receive in is dropped there; the acceptor is
/// ready a millisecond or two later, not the transport's own 50 ms. The
/// acceptor also says when it is ready (a probe, sealed, before any
/// opening of the connector's came), and the connector's opening then
/// goes again at once.
const SYN_FIRST_NS: u64 = 1_000_000;

/// The longest the connector waits before sending its unanswered opening
/// again, ns (as the transport's own connect does).
const SYN_EVERY_NS: u64 = 50_000_000;

/// Frames the kernel sends per doorbell in copy mode (`TX_BATCH_SIZE` of
/// net/xdp/xsk.c).
const KERNEL_TX_BATCH: u32 = 32;

/// The opening's rules of a session whose ids were fixed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fixed {
    /// The acceptor's: the only peer whose opening it takes (`None`: the
    /// connector, whose peer is its `syn_to`).
    accept_from: Option<Peer>,
    /// The connector's opening goes again at this time, ns on the port's
    /// clock.
    syn_due_ns: u64,
    /// The wait before the try after that, ns.
    syn_next_ns: u64,
    /// How long the peer may be silent while this end waits on it, ns.
    silence_ns: u64,
    /// The peer was silent that long: the session is given up.
    silent: bool,
    /// This end reset the connection: it takes nothing more, and answers
    /// the peer's frames with a reset.
    reset_sent: bool,
    /// The peer reset the connection.
    reset_by_peer: bool,
}

impl Fixed {
    /// The connection was reset, by either end.
    pub(super) fn ended(&self) -> bool {
        self.reset_sent || self.reset_by_peer
    }
}

/// A session to open with ids the relays fixed.
pub(crate) struct FixedOpening {
    /// This end's flow id (not 0).
    pub(crate) local_flow: u16,
    /// The other end: its MAC and flow id (not 0).
    pub(crate) peer: Peer,
    /// This end sends the opening (else it takes the peer's).
    pub(crate) connector: bool,
    /// The connection's frame keys, this end's side.
    pub(crate) keys: FrameKeys,
    /// How long the peer may be silent while this end waits on it.
    pub(crate) silence_limit: Duration,
}

/// A fixed session as one call sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedState {
    /// The opening was answered.
    pub(crate) open: bool,
    /// Bytes ready to read.
    pub(crate) ready_bytes: usize,
    /// The peer ended its stream and every byte before the end was read.
    pub(crate) peer_finished: bool,
    /// A send would take at least one byte now.
    pub(crate) room: bool,
    /// This end's closing frame was sent and everything it sent is
    /// acknowledged.
    pub(crate) all_acknowledged: bool,
    /// The peer was silent past the limit: the session is given up.
    pub(crate) silent: bool,
    /// The peer reset the connection.
    pub(crate) reset_by_peer: bool,
    /// This end reset the connection.
    pub(crate) reset_sent: bool,
    /// When a pump must run even without frames: a retransmission, a
    /// probe, a delayed acknowledgment, the opening again, frames waiting
    /// on the TX ring, the silence limit. `None`: nothing armed.
    pub(crate) next_timer: Option<Duration>,
}

/// A fixed session's counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedCounts {
    /// The session's frame counts.
    pub(crate) stats: DatagramStats,
    /// Frames that reached the port and were not this connection's (other
    /// flow ids, another MAC, failing authentication): dropped.
    pub(crate) refused_frames: u64,
    /// Frames the kernel dropped on their way to the socket (no fill
    /// buffer, the receive ring full).
    pub(crate) kernel_drops: u64,
    /// The session's retransmission timeouts that expired (its
    /// retransmissions less those a hole in the acknowledgments asked for).
    pub(crate) timeouts: u64,
}

impl Session {
    /// The timers of a fixed session before the ordinary ones: the
    /// silence limit and the connector's opening again, and the closing
    /// frame once credit allows. Whether the ordinary timers run.
    pub(super) fn fixed_timers(&mut self, io: &mut PortIo, now: u64) -> bool {
        let Some(f) = self.fixed else { return true };
        if f.silent || f.ended() {
            return false;
        }
        let waiting = self.peer.is_none() || !self.send.idle();
        if waiting && now.saturating_sub(self.heard_ns) >= f.silence_ns {
            self.fixed = Some(Fixed { silent: true, ..f });
            self.woken = true;
            return false;
        }
        if self.peer.is_none() {
            if f.accept_from.is_none() && now >= f.syn_due_ns {
                self.fixed = Some(Fixed {
                    syn_due_ns: now.saturating_add(f.syn_next_ns),
                    syn_next_ns: f.syn_next_ns.saturating_mul(2).min(SYN_EVERY_NS),
                    ..f
                });
                self.post(io, Kind::Syn, 0, &[], false);
            }
            return false;
        }
        if self.fin_wanted && !self.fin_sent {
            self.send_fin(io);
        }
        true
    }

    /// A frame for a fixed session not open yet: the connector takes the
    /// answer to its opening from exactly the peer's MAC and flow id, the
    /// acceptor the opening from them, both only when it verifies under
    /// the connection's keys; anything else is dropped and counted.
    pub(super) fn on_fixed_opening(
        &mut self,
        io: &mut PortIo,
        h: &Header,
        src: Mac,
        raw: &[u8],
        now: u64,
    ) {
        let Some(f) = self.fixed else { return };
        let from_peer = |p: &Peer| p.mac == src && p.flow == h.src_flow;
        if f.ended() || h.kind == Kind::Reset {
            // Only the one peer's, and only authentic: the connector's
            // opening answered with a reset, or the acceptor's reset
            // before its answer.
            let expected = f.accept_from.or(self.syn_to);
            if !(expected.is_some_and(|p| from_peer(&p)) && self.guard.admit(raw)) {
                io.strays += 1;
            } else if h.kind == Kind::Reset {
                self.on_reset();
            } else {
                self.after_reset(io, h.kind);
            }
            return;
        }
        if f.accept_from.is_none() && h.kind == Kind::Probe {
            // The acceptor is ready: the opening goes again now (the one
            // before may have come too early), and the resends start
            // over from the shortest wait.
            if self.syn_to.is_some_and(|p| from_peer(&p)) && self.guard.admit(raw) {
                self.fixed = Some(Fixed {
                    syn_due_ns: now.saturating_add(SYN_FIRST_NS),
                    syn_next_ns: SYN_FIRST_NS.saturating_mul(2),
                    ..f
                });
                self.post(io, Kind::Syn, 0, &[], false);
            } else {
                io.strays += 1;
            }
            return;
        }
        let peer = match f.accept_from {
            None => self
                .syn_to
                .filter(|p| h.kind == Kind::SynAck && h.ack == self.isn && from_peer(p)),
            Some(p) => (h.kind == Kind::Syn && from_peer(&p)).then_some(p),
        };
        let Some(peer) = peer.filter(|_| self.guard.admit(raw)) else {
            io.strays += 1;
            return;
        };
        self.opened(h);
        self.peer = Some(peer);
        let acceptor = f.accept_from.is_some();
        self.side = Some(if acceptor { Side::Server } else { Side::Client });
        self.woken = true;
        self.heard_ns = now;
        // The acceptor answers; the connector's third leg tells the
        // acceptor its answer arrived.
        let reply = if acceptor { Kind::SynAck } else { Kind::Ack };
        self.post(io, reply, 0, &[], false);
    }

    /// Resets the connection from this end: a reset goes to the peer (or,
    /// before the opening, to the one peer it may come from), and nothing
    /// is sent again or taken from now on. Once only.
    pub(super) fn fixed_reset(&mut self, io: &mut PortIo) {
        let Some(f) = self.fixed else { return };
        if f.ended() || f.silent {
            return;
        }
        self.fixed = Some(Fixed {
            reset_sent: true,
            ..f
        });
        self.woken = true;
        self.post_reset(io);
    }

    /// An authentic frame of `kind` from the peer after the connection
    /// was reset: this end's reset again (the first may have been lost),
    /// never in answer to a reset.
    pub(super) fn after_reset(&mut self, io: &mut PortIo, kind: Kind) {
        if kind == Kind::Reset {
            self.on_reset();
        } else if self.fixed.is_some_and(|f| f.reset_sent) {
            self.post_reset(io);
        }
    }

    /// The peer's authentic reset: every call fails from now on.
    pub(super) fn on_reset(&mut self) {
        let Some(f) = self.fixed else { return };
        if !f.reset_by_peer {
            self.fixed = Some(Fixed {
                reset_by_peer: true,
                ..f
            });
            self.woken = true;
        }
    }

    /// Queues a reset to the peer (sealed, kept by nobody).
    fn post_reset(&mut self, io: &mut PortIo) {
        let seq = self.send.next_seq();
        let _ = self.post_with(io, Kind::Reset, seq, &[], false, (0, 0, 0));
    }

    /// Where this session's frames go: its peer, the server its opening
    /// went to, or, for a fixed acceptor not open yet, the one peer whose
    /// opening it takes.
    pub(super) fn addressee(&self) -> Option<Peer> {
        self.peer
            .or(self.syn_to)
            .or_else(|| self.fixed.and_then(|f| f.accept_from))
    }

    /// The fixed session as a call sees it at `now`.
    fn fixed_state(&self, io: &PortIo, now: u64) -> FixedState {
        let f = self.fixed;
        let silent = f.is_some_and(|f| f.silent);
        let ended = f.is_some_and(|f| f.ended());
        let open = self.peer.is_some();
        let room = open
            && self.send.may_send()
            && self.send.in_flight() < io.share
            && io.free_tx.len() > CONTROL_RESERVE_FRAMES;
        FixedState {
            open,
            ready_bytes: self.recv.ready_bytes(),
            peer_finished: self.recv.finished(),
            room,
            all_acknowledged: self.fin_sent && self.send.idle(),
            silent,
            reset_by_peer: f.is_some_and(|f| f.reset_by_peer),
            reset_sent: f.is_some_and(|f| f.reset_sent),
            next_timer: if silent || ended {
                None
            } else {
                self.fixed_next_timer(io, now)
            },
        }
    }

    /// When a pump must run next, from `now`.
    fn fixed_next_timer(&self, io: &PortIo, now: u64) -> Option<Duration> {
        if io.tx_backlog() {
            return Some(Duration::ZERO);
        }
        let f = self.fixed.filter(|f| !f.ended())?;
        // Before the opening is answered the send window has no credit
        // and the session sends no probe, so the window's probe deadline
        // (long past) must not arm a timer: a waiter would be woken at
        // once, again and again, spinning on its CPU until the peer's
        // opening came (an acceptor whose connector's grant came later,
        // 10 to 30 ms on a loaded host). Only the silence limit and the
        // connector's opening again are due then.
        let mut next = if self.peer.is_some() {
            self.next_timer(now)
        } else {
            None
        };
        let mut arm = |at_ns: u64| {
            let d = Duration::from_nanos(at_ns.saturating_sub(now));
            next = Some(next.map_or(d, |n| n.min(d)));
        };
        if self.peer.is_none() || !self.send.idle() {
            arm(self.heard_ns.saturating_add(f.silence_ns));
        }
        if self.peer.is_none() && f.accept_from.is_none() {
            arm(f.syn_due_ns);
        }
        next
    }

    /// The start of a wait on the peer: a send or closing frame when
    /// nothing was unacknowledged (the silence limit counts from here).
    fn waits_from(&mut self, now: u64) {
        if self.send.idle() {
            self.heard_ns = now;
        }
    }
}

impl PortState {
    /// One pump of a port of fixed session `id`, unless it would find
    /// nothing: no frame on the RX or completion ring, none waiting to be
    /// sent, and no timer of the session due at a fresh clock read. A
    /// program that spins on its calls then pays a clock read and a few
    /// loads a call, not a whole pump; one that calls after a wait of any
    /// length still has its timers served, since the clock is read every
    /// time.
    fn pump_fixed(&mut self, id: u16) {
        let io = &mut self.io;
        if !io.tx_queued && !io.stamps_due && io.tx_outstanding == 0 && !io.xsk.anything_arrived() {
            let now = io.now_ns();
            if let Ok((io, s)) = self.session(id) {
                if s.fixed_next_timer(io, now).is_none_or(|d| !d.is_zero()) {
                    io.now_cache_ns = now;
                    io.clock_read = true;
                    return;
                }
            }
        }
        self.pump(true);
    }
}

impl Port {
    /// A port of one connection's own over `io` (payload `mss` bytes a
    /// frame, a receive window of `window_bytes`), in no process-wide
    /// list: nothing else opens a session on it.
    pub(crate) fn alone(
        io: PortIo,
        mss: usize,
        window_bytes: usize,
        random: fn() -> io::Result<u32>,
    ) -> Arc<Port> {
        Port::new(io, mss, window_bytes, random, None)
    }

    /// The port's socket: readable when frames wait on its RX ring.
    pub(crate) fn socket_fd(&self) -> RawFd {
        self.fd
    }

    /// Opens the session `o` describes, keyed from the first frame; the
    /// connector's opening goes at once (again every 50 ms until
    /// answered, from the pumps). Returns its flow id.
    pub(crate) fn open_fixed(&self, o: FixedOpening) -> Result<u16, FlowError> {
        let mut st = self.lock();
        if st.table.index(o.local_flow).is_some() {
            return Err(FlowError::Io(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("flow {} is already open on this port", o.local_flow),
            )));
        }
        let mut s = st.new_session().map_err(FlowError::Io)?;
        let now = st.io.now_ns();
        s.local_flow = o.local_flow;
        s.guard.set_keys(o.keys);
        s.heard_ns = now;
        s.fixed = Some(Fixed {
            accept_from: (!o.connector).then_some(o.peer),
            syn_due_ns: now.saturating_add(SYN_FIRST_NS),
            syn_next_ns: SYN_FIRST_NS.saturating_mul(2),
            silence_ns: u64::try_from(o.silence_limit.as_nanos()).unwrap_or(u64::MAX),
            silent: false,
            reset_sent: false,
            reset_by_peer: false,
        });
        if o.connector {
            s.syn_to = Some(o.peer);
            s.post(&mut st.io, Kind::Syn, 0, &[], false);
        } else {
            // The acceptor's word that it is ready, its buffers given to
            // the kernel: an opening that came before was dropped here,
            // and the connector sends it again at once rather than at
            // its next resend.
            s.post_with(&mut st.io, Kind::Probe, 0, &[], false, (0, 0, 0));
        }
        st.table.insert(o.local_flow, s);
        st.reshare();
        st.io.flush();
        Ok(o.local_flow)
    }

    /// Pumps the port once, then runs `f` on fixed session `id` at the
    /// pump's time; fails if the session was given up, reset (unless
    /// `reads` and bytes that arrived before the peer's reset are still
    /// unread: the kernel's reads take those first too), or a doorbell
    /// failed.
    fn with_fixed<T>(
        &self,
        id: u16,
        reads: bool,
        f: impl FnOnce(&mut PortIo, &mut Session, u64) -> T,
    ) -> Result<T, FlowError> {
        let out = {
            let mut st = self.lock();
            st.pump_fixed(id);
            let (io, s) = st.session(id)?;
            if s.fixed.is_some_and(|f| f.silent) {
                return Err(silent_error(s));
            }
            let unread = reads && s.recv.ready_bytes() > 0;
            if s.fixed
                .is_some_and(|f| f.reset_sent || f.reset_by_peer && !unread)
            {
                return Err(FlowError::Closed);
            }
            let now = io.now_cache_ns;
            f(io, s, now)
        };
        // The guard rang the doorbell as it went; its error is read now.
        self.kick_error()?;
        Ok(out)
    }

    /// Sends as much of `buf` as the window, credit and buffers allow
    /// (0: none now, or not open yet), after one pump; what it queued is
    /// on the wire when it returns ([`Port::drain_tx`]).
    pub(crate) fn fixed_send(&self, id: u16, buf: &[u8]) -> Result<usize, FlowError> {
        let (n, outstanding) = self.with_fixed(id, false, |io, s, now| {
            if !s.connected() || buf.is_empty() {
                return Ok((0, 0));
            }
            s.waits_from(now);
            let n = s.send_some(io, buf)?;
            Ok::<_, FlowError>((n, io.tx_outstanding))
        })??;
        // One doorbell (the guard's) sends a batch; more wait for pumps.
        if outstanding > KERNEL_TX_BATCH {
            self.drain_tx(outstanding)?;
        }
        Ok(n)
    }

    /// Pumps until the kernel has taken the `outstanding` frames on the TX
    /// ring: in copy mode it sends a bounded batch per doorbell, and the
    /// program may make no other call for a long while after a write, so
    /// the rest must not wait on the ring for the next one. Bounded by the
    /// ring's batches.
    fn drain_tx(&self, outstanding: u32) -> Result<(), FlowError> {
        let mut rounds = outstanding / KERNEL_TX_BATCH + 2;
        loop {
            let backlog = {
                let mut st = self.lock();
                st.pump(true);
                st.io.tx_backlog()
            };
            self.kick_error()?;
            rounds = rounds.saturating_sub(1);
            if !backlog || rounds == 0 {
                return Ok(());
            }
        }
    }

    /// Reads into `buf` (not empty) after one pump: `Some(n)` bytes read,
    /// `Some(0)` at the peer's end of stream, `None` when nothing is
    /// ready.
    pub(crate) fn fixed_recv(&self, id: u16, buf: &mut [u8]) -> Result<Option<usize>, FlowError> {
        self.with_fixed(id, true, |io, s, now| {
            if s.recv.ready_bytes() > 0 {
                let n = s.recv.read(buf);
                if s.recv.ack_due(now) && !s.fixed.is_some_and(|f| f.ended()) {
                    // Reading opened room: tell a sender waiting for
                    // credit.
                    s.post(io, Kind::Ack, 0, &[], false);
                    io.flush();
                }
                return Some(n);
            }
            s.recv.finished().then_some(0)
        })
    }

    /// Ends this end's stream: the closing frame goes after what was sent,
    /// now if credit allows, else from a later pump.
    pub(crate) fn fixed_shutdown(&self, id: u16) -> Result<(), FlowError> {
        self.with_fixed(id, false, |io, s, now| {
            if s.fin_wanted {
                return;
            }
            s.fin_wanted = true;
            if s.connected() {
                s.waits_from(now);
                s.send_fin(io);
            }
        })
    }

    /// Resets fixed session `id` from this end (see the module's notes),
    /// after one pump; nothing if it was reset or given up already.
    pub(crate) fn fixed_reset(&self, id: u16) -> Result<(), FlowError> {
        {
            let mut st = self.lock();
            st.pump_fixed(id);
            let (io, s) = st.session(id)?;
            s.fixed_reset(io);
            st.io.flush();
        }
        self.kick_error()
    }

    /// Fixed session `id` now, after one pump if `pump` (else on the
    /// port's clock read now, touching no ring).
    pub(crate) fn fixed_state(&self, id: u16, pump: bool) -> Result<FixedState, FlowError> {
        let state = {
            let mut st = self.lock();
            if pump {
                st.pump_fixed(id);
            }
            let (io, s) = st.session(id)?;
            let now = if pump { io.now_cache_ns } else { io.now_ns() };
            s.fixed_state(io, now)
        };
        if pump {
            self.kick_error()?;
        }
        Ok(state)
    }

    /// Fixed session `id`'s counters, without a pump.
    pub(crate) fn fixed_counts(&self, id: u16) -> Result<FixedCounts, FlowError> {
        let mut st = self.lock();
        let refused = st
            .table
            .drops()
            .unknown_flow_frames
            .saturating_add(st.io.strays);
        let kernel_drops = st.io.xsk.kernel_drops().unwrap_or(0);
        let (_, s) = st.session(id)?;
        Ok(FixedCounts {
            stats: s.stats,
            refused_frames: refused,
            kernel_drops,
            timeouts: s.send.timeouts,
        })
    }
}

/// The error of a session given up on a silent peer.
fn silent_error(s: &Session) -> FlowError {
    let ms = s.fixed.map_or(0, |f| u128::from(f.silence_ns / 1_000_000));
    FlowError::TimedOut { timeout_ms: ms }
}
