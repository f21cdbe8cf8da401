//! The data path of the `xdp` transport: one *port* per interface and
//! process (an AF_XDP socket with its UMEM, [`Xsk`]), shared by every xdp
//! flow of the process on that interface, each flow a *session* on it
//! driven by the reliable-delivery state machines of [`super::reliable`].
//! Arrivals go to their session by destination flow id
//! ([`super::demux`]). The application's threads do the work themselves,
//! as in VIA: a send copies payload into UMEM frames, posts their
//! descriptors on the TX ring and rings the doorbell; a receive reaps the
//! RX ring. Each call also reaps completions, refills the fill ring (a
//! batch at a time), moves every session's arrivals into that session (a
//! data frame's payload straight from the UMEM into the session's
//! reassembly buffer, its one copy), takes acknowledgments, resends what
//! timed out and acknowledges what arrived (one "pump" of the port, under
//! the port's lock, so any flow's caller serves them all, and the two
//! halves of a flow may run on two threads).
//!
//! Waiting: in `poll` mode a caller spins, pumping; in `event` mode one
//! waiting caller of a session sleeps in poll() on the socket (and on the
//! session's eventfd, which a pump rings when it moved something the
//! session waits for), any other waits on the session's condition
//! variable, woken by every pump that moved something for it.
//!
//! UMEM layout: the first half of the frames are receive buffers (always
//! on the fill ring or the RX ring), the second half transmit buffers,
//! shared by the sessions: a session's data frames in flight are bounded
//! by its share (the buffers left after a reserve for control frames,
//! divided among the sessions), so one stream cannot starve the others'
//! acknowledgments. A data frame's buffer stays the sender's until the
//! frame is acknowledged (so it can be sent again as it is) and the kernel
//! has completed every send of it; a control frame's buffer is free once
//! completed.
//!
//! Authentication: each end draws its initial sequence number at random;
//! once the session's data proof hands the flow its key
//! ([`XdpFlow::bind_session`]), every frame is sealed before it is queued
//! and every arrival from the peer must verify ([`super::auth::Guard`]);
//! one that does not is dropped and counted, and changes nothing.

use super::auth::{End, FrameKeys, Guard, Side};
use super::demux::{Route, Table};
use super::reliable::{
    self, AckOutcome, Arrival, Header, Kind, Mac, RecvWindow, SendWindow, FRAME_OVERHEAD_BYTES,
};
use super::sys::{Attach, Xsk};
use crate::{DatagramStats, Flow, FlowError, FlowMonitor, Receiver, Sender};
use netgap_core::spec::Mode;
use netgap_proto::dataproof::FlowKey;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Receive frames reaped per pump at most.
const RX_BATCH: u32 = 64;
/// Receive buffers given back to the fill ring together. Filling reads the
/// kernel's consumer index, which the other CPU writes on every arrival (a
/// cache miss each time): in batches, one miss serves many buffers. The
/// kernel keeps all but fewer than this many of the port's receive buffers
/// meanwhile.
const FILL_BATCH: usize = 32;
/// Spins between yields of the CPU while polling: rare, since a frame
/// that arrives during a yield (a system call) waits for it to return.
const SPINS_PER_YIELD: u32 = 1024;
/// Pumps that found nothing between clock reads: the timers they serve
/// (retransmission, probe, delayed acknowledgment) are milliseconds and
/// hundreds of microseconds long, a pump a fraction of a microsecond.
const PUMPS_PER_CLOCK_READ: u32 = 64;
/// Longest sleep of an event-mode waiter before it pumps again.
const MAX_SLEEP: Duration = Duration::from_millis(5);
/// How long a closing flow keeps sending what is unacknowledged.
const LINGER: Duration = Duration::from_millis(300);
/// Bytes a session opened by a SYN may hold unread until the application
/// accepts it (then the port's full window): a flood of forged openings,
/// capped at [`super::demux::MAX_HALF_OPEN`] sessions, holds little memory.
const HALF_OPEN_WINDOW_BYTES: usize = 64 << 10;
/// Transmit buffers only control frames (acknowledgments, openings,
/// probes) may take: data never holds them, so every session can always
/// acknowledge.
const CONTROL_RESERVE_FRAMES: usize = 64;
/// Receive buffers no session's credit counts on: those the pump holds
/// before it gives them back in a batch, and room for control frames.
const RX_RESERVE_FRAMES: usize = FILL_BATCH + RX_BATCH as usize + 64;

/// The monotonic clock, ns: the clock `Instant` reads (CLOCK_MONOTONIC,
/// through the vDSO), without its conversions through `Duration` and
/// `u128`, since the data path reads it on every frame that arrives and
/// every send.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local; with
    // CLOCK_MONOTONIC it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The two ends' addresses of a flow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    /// The peer's MAC.
    pub mac: Mac,
    /// The peer's flow id.
    pub flow: u16,
}

/// The socket's side of a port: its rings, its transmit buffers, its
/// clock, and the pump's scratch.
pub(crate) struct PortIo {
    xsk: Xsk,
    local_mac: Mac,
    tx_first: u32,
    free_tx: Vec<u32>,
    /// Per transmit buffer: sends the kernel has not completed yet.
    tx_pending: Vec<u16>,
    /// Per transmit buffer: free once its sends complete (acknowledged
    /// data, or a control frame).
    tx_release: Vec<bool>,
    tx_queued: bool,
    /// The doorbell is due: rung by the port's guard once it has let the
    /// lock go (see [`PortGuard`]).
    kick_wanted: bool,
    /// Frames on the TX ring whose sending has not completed: the kernel
    /// sends a bounded batch per doorbell (32 in copy mode), so the bell
    /// rings again while any wait.
    tx_outstanding: u32,
    /// Data frames each session may keep in flight: the buffers past the
    /// control reserve, shared evenly (set when sessions come and go).
    share: usize,
    /// The monotonic clock when the port opened, ns.
    t0_ns: u64,
    /// The clock as the latest pump read it, ns since `t0_ns`.
    now_cache_ns: u64,
    /// Pumps since the clock was last read.
    pumps_unclocked: u32,
    /// The latest pump read the clock (`now_cache_ns` is fresh).
    clock_read: bool,
    /// Scratch of the pump, kept so that it allocates nothing: slots
    /// completed or received, the bytes of the frames copied out, the
    /// frames received in order (taken in place, or where each copied one
    /// ends), and what an acknowledgment freed.
    scratch_slots: Vec<u32>,
    /// Receive buffers emptied and not yet given back (fewer than
    /// [`FILL_BATCH`] after each pump).
    fill_pending: Vec<u32>,
    scratch_frames: Vec<u8>,
    scratch_taken: Vec<Pending>,
    scratch_ack: AckOutcome,
    /// Frames for a session from anyone but its peer, or failing
    /// authentication: dropped.
    strays: u64,
}

impl PortIo {
    /// Takes the transmit buffers the kernel is done with off the
    /// completion ring (into `slots`) and frees those no frame still needs.
    #[inline]
    fn reap_completions(&mut self, slots: &mut Vec<u32>) {
        self.xsk.completed(u32::MAX, slots);
        for &slot in slots.iter() {
            self.tx_outstanding = self.tx_outstanding.saturating_sub(1);
            if let Some(i) = self.tx_index(slot) {
                self.tx_pending[i] = self.tx_pending[i].saturating_sub(1);
                self.release_if_done(slot);
            }
        }
    }

    /// Gives the receive buffers `slots` back to the fill ring once a batch
    /// of them waits, kicking the kernel if it asked to be.
    #[inline]
    fn refill(&mut self, slots: &[u32]) {
        self.fill_pending.extend_from_slice(slots);
        if self.fill_pending.len() >= FILL_BATCH {
            if self.xsk.fill(&self.fill_pending) == self.fill_pending.len() {
                self.fill_pending.clear();
            }
            if self.xsk.fill_needs_wakeup() {
                let _ = self.xsk.kick();
            }
        }
    }

    /// The socket side of a port over `xsk`, whose UMEM has `frames`
    /// frames, half for receiving, on the interface of MAC `local_mac`.
    pub(crate) fn new(mut xsk: Xsk, frames: u32, local_mac: Mac) -> io::Result<PortIo> {
        let rx_frames = frames / 2;
        let rx: Vec<u32> = (0..rx_frames).collect();
        if xsk.fill(&rx) != rx.len() {
            return Err(io::Error::other("the fill ring took no receive buffers"));
        }
        let tx_count = frames - rx_frames;
        Ok(PortIo {
            xsk,
            local_mac,
            tx_first: rx_frames,
            free_tx: (rx_frames..frames).rev().collect(),
            tx_pending: vec![0; tx_count as usize],
            tx_release: vec![false; tx_count as usize],
            tx_queued: false,
            kick_wanted: false,
            tx_outstanding: 0,
            share: (tx_count as usize).saturating_sub(CONTROL_RESERVE_FRAMES),
            t0_ns: monotonic_ns(),
            now_cache_ns: 0,
            pumps_unclocked: 0,
            clock_read: false,
            scratch_slots: Vec::with_capacity(RX_BATCH as usize),
            fill_pending: Vec::with_capacity(FILL_BATCH + RX_BATCH as usize),
            scratch_frames: Vec::new(),
            scratch_taken: Vec::with_capacity(RX_BATCH as usize),
            scratch_ack: AckOutcome::default(),
            strays: 0,
        })
    }

    fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.t0_ns)
    }

    fn tx_index(&self, slot: u32) -> Option<usize> {
        let i = slot.checked_sub(self.tx_first)? as usize;
        (i < self.tx_pending.len()).then_some(i)
    }

    fn release_if_done(&mut self, slot: u32) {
        if let Some(i) = self.tx_index(slot) {
            if self.tx_pending[i] == 0 && self.tx_release[i] {
                self.tx_release[i] = false;
                self.free_tx.push(slot);
            }
        }
    }

    /// Asks for the doorbell: the port's guard rings it after letting
    /// the lock go, so that the kernel's transmit (in copy mode the whole
    /// delivery through the link, during the call) does not hold the port
    /// from its other threads.
    fn flush(&mut self) {
        if self.tx_queued || self.tx_outstanding > 0 {
            self.tx_queued = false;
            self.kick_wanted = true;
        }
    }

    /// Frames still wait on the TX ring for the doorbell.
    fn tx_backlog(&self) -> bool {
        self.tx_outstanding > 0
    }

    /// Transmit buffers of the port.
    fn tx_count(&self) -> usize {
        self.tx_pending.len()
    }
}

/// What wakes a session's waiters (event mode).
pub(crate) struct Signal {
    cv: Condvar,
    bell: OwnedFd,
}

impl Signal {
    fn new() -> io::Result<Arc<Signal>> {
        // SAFETY: eventfd with no initial count and valid flags; the result
        // is checked and owned at once.
        let bell = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if bell < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Signal {
            cv: Condvar::new(),
            // SAFETY: `bell` is a new descriptor nothing else owns.
            bell: unsafe { OwnedFd::from_raw_fd(bell) },
        }))
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        let _ = unsafe {
            libc::write(
                self.bell.as_raw_fd(),
                (&raw const one).cast::<libc::c_void>(),
                8,
            )
        };
    }

    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our non-blocking
        // eventfd.
        let _ = unsafe {
            libc::read(
                self.bell.as_raw_fd(),
                (&raw mut v).cast::<libc::c_void>(),
                8,
            )
        };
    }
}

/// One flow's state on a port.
pub(crate) struct Session {
    local_flow: u16,
    peer: Option<Peer>,
    /// Payload bytes per frame this end sends: the smaller of its own and
    /// the peer's largest.
    mss: usize,
    /// Payload bytes per frame this end takes.
    recv_mss: usize,
    send: SendWindow,
    recv: RecvWindow,
    stats: DatagramStats,
    /// Frames moved into this session (a waiter sees progress).
    arrivals: u64,
    /// The latest pump moved something into it: its waiters are woken.
    woken: bool,
    /// A waiter sleeps in poll() on the socket and must be rung.
    poller: bool,
    /// Callers waiting on the condition variable (event mode): a pump
    /// notifies only when there is one, since a notification is a system
    /// call (a futex wake) even when nobody waits.
    cv_waiters: u32,
    signal: Arc<Signal>,
    /// The server this end's opening went to (client side, until open).
    syn_to: Option<Peer>,
    /// This end said its stream ended.
    fin_sent: bool,
    /// The initial sequence number of what this end sends.
    isn: u32,
    /// The peer's initial sequence number, from its opening.
    peer_isn: u32,
    /// Which end of the flow this is, once it is open.
    side: Option<Side>,
    /// Bytes the receiver holds unread.
    window_bytes: usize,
    /// Data frames this end may keep in flight at most.
    max_inflight: u32,
    /// Seals what goes out and checks what comes in, once keyed.
    guard: Guard,
}

impl Session {
    fn new(
        local_flow: u16,
        mss: usize,
        window_bytes: usize,
        isn: u32,
        (tx_count, credit_cap): (usize, u32),
    ) -> io::Result<Session> {
        let max_inflight = send_buffers(tx_count);
        Ok(Session {
            local_flow,
            peer: None,
            mss,
            recv_mss: mss,
            send: SendWindow::new(isn, 0, max_inflight),
            // Until the peer's opening names its initial sequence number.
            recv: RecvWindow::capped(0, mss, window_bytes, credit_cap),
            stats: DatagramStats::default(),
            arrivals: 0,
            woken: false,
            poller: false,
            cv_waiters: 0,
            signal: Signal::new()?,
            syn_to: None,
            fin_sent: false,
            isn,
            peer_isn: 0,
            side: None,
            window_bytes,
            max_inflight,
            guard: Guard::new(),
        })
    }

    /// Writes a frame of `kind` into a free transmit buffer and queues it;
    /// `None` when no buffer or ring entry is free. `keep` keeps the
    /// buffer after completion (a data frame, until acknowledged).
    fn post(
        &mut self,
        io: &mut PortIo,
        kind: Kind,
        seq: u32,
        payload: &[u8],
        keep: bool,
    ) -> Option<u32> {
        let peer = self.peer.or(self.syn_to)?;
        let slot = io.free_tx.pop()?;
        // An opening carries this end's initial sequence number, the
        // frames the peer may send (a span: the client does not know the
        // server's number yet) and the largest payload this end takes; the
        // answer echoes the client's number.
        let (seq, ack, credit, sack) = match kind {
            Kind::Syn | Kind::SynAck => (
                self.isn,
                if kind == Kind::SynAck {
                    self.peer_isn
                } else {
                    0
                },
                self.recv.credit_frames(),
                self.recv_mss as u64,
            ),
            _ => {
                let (ack, credit, sack) = self.recv.take_ack();
                (seq, ack, credit, sack)
            }
        };
        let header = Header {
            kind,
            len: u16::try_from(payload.len()).unwrap_or(u16::MAX),
            dst_flow: peer.flow,
            src_flow: self.local_flow,
            seq,
            ack,
            credit,
            sack,
        };
        let local = io.local_mac;
        let frame = io.xsk.frame_mut(slot);
        let len = reliable::write_headers(frame, &peer.mac, &local, &header);
        frame[FRAME_OVERHEAD_BYTES..len].copy_from_slice(payload);
        self.guard.seal(&mut frame[..len]);
        let i = io.tx_index(slot)?;
        io.tx_release[i] = !keep;
        if !io.xsk.queue_tx(slot, len as u32) {
            io.free_tx.push(slot);
            return None;
        }
        io.tx_pending[i] = io.tx_pending[i].saturating_add(1);
        io.tx_queued = true;
        io.tx_outstanding += 1;
        if matches!(kind, Kind::Data | Kind::Fin) {
            self.stats.datagrams_sent += 1;
        }
        Some(slot)
    }

    /// Sends a kept data frame's buffer again, as it is (its header's
    /// acknowledgment fields are refreshed).
    fn resend(&mut self, io: &mut PortIo, slot: u32) {
        let Some(i) = io.tx_index(slot) else { return };
        let (ack, credit, sack) = self.recv.take_ack();
        let frame = io.xsk.frame_mut(slot);
        let Ok(parsed) = reliable::parse(frame) else {
            return;
        };
        let mut header = parsed.header;
        let dst = frame_dst(frame);
        let src = parsed.src;
        header.ack = ack;
        header.credit = credit;
        header.sack = sack;
        let len = reliable::write_headers(frame, &dst, &src, &header);
        // Sealed again: the acknowledgment fields changed, and the flow
        // may have been keyed since the first send.
        self.guard.seal(&mut frame[..len]);
        if io.xsk.queue_tx(slot, len as u32) {
            io.tx_pending[i] = io.tx_pending[i].saturating_add(1);
            io.tx_queued = true;
            io.tx_outstanding += 1;
            self.stats.datagrams_sent += 1;
            self.stats.retries += 1;
        }
    }

    /// The session's timers at `now`: retransmissions, a probe, a delayed
    /// acknowledgment.
    fn on_timers(&mut self, io: &mut PortIo, now: u64) {
        if self.peer.is_none() {
            return;
        }
        for f in self.send.due(now) {
            self.resend(io, f.slot);
        }
        self.stats.retries = self.send.retransmits;
        if self.send.probe_due(now) {
            self.post(io, Kind::Probe, 0, &[], false);
        }
        if self.recv.ack_due(now) {
            self.post(io, Kind::Ack, 0, &[], false);
        }
    }

    /// Takes frame `raw`, parsed as `h` from `src` with `payload`, routed
    /// here.
    fn on_frame(
        &mut self,
        io: &mut PortIo,
        h: &Header,
        src: Mac,
        payload: &[u8],
        raw: &[u8],
        now: u64,
    ) {
        let Some(peer) = self.peer else {
            // The answer of the server this end asked, to this end's
            // opening (its initial sequence number echoed), from the
            // session it opened for this flow (its own flow id).
            if h.kind == Kind::SynAck
                && h.ack == self.isn
                && h.src_flow != 0
                && self.syn_to.is_some_and(|p| p.mac == src)
            {
                self.opened(h);
                self.peer = Some(Peer {
                    mac: src,
                    flow: h.src_flow,
                });
                self.side = Some(Side::Client);
                self.woken = true;
                // The third leg: the server's session hears from this end
                // before anything is sent, so it is not left half-open.
                self.post(io, Kind::Ack, 0, &[], false);
            }
            return;
        };
        if h.src_flow != peer.flow || src != peer.mac || !self.guard.admit(raw) {
            // Not the peer's (or altered on the way): as if never arrived.
            io.strays += 1;
            return;
        }
        match h.kind {
            Kind::Syn => {
                // Our SYN-ACK was lost: say it again (to the same opening
                // only).
                if h.seq == self.peer_isn {
                    self.post(io, Kind::SynAck, 0, &[], false);
                }
                return;
            }
            Kind::SynAck => return,
            Kind::Data | Kind::Fin => self.on_data(h, payload, now),
            Kind::Probe => self.recv.on_probe(),
            Kind::Ack => {}
        }
        self.on_acknowledgment(io, h, now);
    }

    /// Takes the payload of an authenticated data or closing frame `h`.
    fn on_data(&mut self, h: &Header, payload: &[u8], now: u64) {
        self.stats.datagrams_received += 1;
        let arrival = self.recv.on_frame(h.seq, payload, h.kind == Kind::Fin, now);
        if arrival == Arrival::Duplicate {
            self.stats.duplicates += 1;
        }
    }

    /// Takes the acknowledgment fields of an authenticated frame `h` from
    /// the peer: frees what they acknowledge, resends what they show lost,
    /// and wakes the session's waiters.
    fn on_acknowledgment(&mut self, io: &mut PortIo, h: &Header, now: u64) {
        let mut out = std::mem::take(&mut io.scratch_ack);
        self.send
            .on_ack_into(h.ack, h.credit, h.sack, now, &mut out);
        for &slot in &out.freed {
            if let Some(i) = io.tx_index(slot) {
                io.tx_release[i] = true;
                io.release_if_done(slot);
            }
        }
        for f in &out.resend {
            self.resend(io, f.slot);
        }
        io.scratch_ack = out;
        self.woken = true;
    }

    /// Takes the peer's opening `h`: its initial sequence number, the
    /// credit it gives and the payload it takes.
    fn opened(&mut self, h: &Header) {
        self.peer_isn = h.seq;
        self.send = SendWindow::new(self.isn, h.credit, self.max_inflight);
        // The cap is the port's share for this session (see
        // `PortState::reshare`), kept across the new window.
        let cap = self.recv.credit_cap_frames();
        self.recv = RecvWindow::capped(h.seq, self.recv_mss, self.window_bytes, cap);
        self.mss = peer_mss(u32::try_from(h.sack).unwrap_or(u32::MAX), self.recv_mss);
    }

    /// Keys the open flow with the proven connection's `key`: from now on
    /// every frame is sealed and every arrival must verify.
    fn bind(&mut self, local_mac: Mac, key: &FlowKey) -> Result<(), FlowError> {
        let (Some(peer), Some(side)) = (self.peer, self.side) else {
            return Err(FlowError::Io(io::Error::other(
                "an xdp flow can be keyed only once it is open",
            )));
        };
        let local = End {
            mac: local_mac,
            flow: self.local_flow,
            isn: self.isn,
        };
        let remote = End {
            mac: peer.mac,
            flow: peer.flow,
            isn: self.peer_isn,
        };
        let (client, server) = match side {
            Side::Client => (local, remote),
            Side::Server => (remote, local),
        };
        self.guard
            .set_keys(FrameKeys::derive(key, side, &client, &server));
        Ok(())
    }

    /// Whether the flow is open (the handshake is done).
    fn connected(&self) -> bool {
        self.peer.is_some()
    }

    /// Sends as much of `buf` as credit, buffers and this session's share
    /// of them allow; returns the bytes taken.
    fn send_some(&mut self, io: &mut PortIo, buf: &[u8]) -> Result<usize, FlowError> {
        let mut taken = 0;
        // One clock read for the frames of one call: they go out together.
        let now = io.now_ns();
        while taken < buf.len()
            && self.send.may_send()
            && self.send.in_flight() < io.share
            && io.free_tx.len() > CONTROL_RESERVE_FRAMES
        {
            let end = (taken + self.mss).min(buf.len());
            let seq = self.send.next_seq();
            let Some(slot) = self.post(io, Kind::Data, seq, &buf[taken..end], true) else {
                break;
            };
            self.send.push(slot, now);
            taken = end;
        }
        if taken > 0 {
            io.flush();
        }
        Ok(taken)
    }

    /// Sends the end of this end's stream once, when credit allows.
    fn send_fin(&mut self, io: &mut PortIo) {
        if self.fin_sent || !self.send.may_send() || io.free_tx.is_empty() {
            return;
        }
        let seq = self.send.next_seq();
        if let Some(slot) = self.post(io, Kind::Fin, seq, &[], true) {
            let now = io.now_ns();
            self.send.push(slot, now);
            self.fin_sent = true;
        }
        io.flush();
    }

    /// When the next timer (a retransmission, a probe, a delayed
    /// acknowledgment) falls due, as a duration from `now_ns`.
    fn next_timer(&self, now_ns: u64) -> Option<Duration> {
        let at = match (self.send.next_deadline_ns(), self.recv.ack_deadline_ns()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(Duration::from_nanos(at.saturating_sub(now_ns)))
    }
}

/// What the pump's first pass did with a frame received.
enum Take {
    /// Data for an open session, taken in place; its acknowledgment fields
    /// wait for the second pass.
    Taken,
    /// Dropped: not from the session's peer, or not authentic.
    Dropped,
    /// Anything else: copied out whole for the second pass.
    Later,
}

/// A frame received, in order of arrival, for the pump's second pass.
#[derive(Clone, Copy)]
pub(crate) enum Pending {
    /// Data whose payload was taken in place: its header.
    Taken(Header),
    /// A frame copied out whole: where its bytes end in the pump's scratch.
    Copied(usize),
}

/// The pump's first pass over frame `raw` (parsed as `p`) where it lies in
/// the UMEM: a data or closing frame for an open session, from its peer and
/// authentic, goes into the session's reassembly buffer at once (its one
/// copy); one for the session from anyone else is dropped, as the second
/// pass would drop it; everything else is left to the second pass.
fn take_data(table: &mut Table<Session>, p: &reliable::Parsed<'_>, raw: &[u8], now: u64) -> Take {
    let h = &p.header;
    if !matches!(h.kind, Kind::Data | Kind::Fin) {
        return Take::Later;
    }
    let Some(i) = table.index(h.dst_flow) else {
        return Take::Later;
    };
    let s = &mut table.slot_mut(i).value;
    let Some(peer) = s.peer else {
        return Take::Later;
    };
    if h.src_flow != peer.flow || p.src != peer.mac {
        return Take::Dropped;
    }
    if !s.guard.admit(raw) {
        // Not the peer's (or altered on the way): as if never arrived.
        return Take::Dropped;
    }
    s.on_data(h, p.payload, now);
    Take::Taken
}

/// Data frames one session may keep in flight: at most half the transmit
/// buffers (as one flow alone always had).
fn send_buffers(tx_count: usize) -> u32 {
    u32::try_from(tx_count / 2).unwrap_or(u32::MAX).max(1)
}

/// The payload per frame toward a peer that takes `theirs` (as its
/// opening said), this end taking `ours`: the smaller, at least 1.
fn peer_mss(theirs: u32, ours: usize) -> usize {
    usize::try_from(theirs).unwrap_or(usize::MAX).clamp(1, ours)
}

/// The MAC a frame is addressed to.
fn frame_dst(frame: &[u8]) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&frame[0..6]);
    m
}

/// Everything of a port behind its lock: the socket side and the sessions.
pub(crate) struct PortState {
    io: PortIo,
    table: Table<Session>,
    /// Payload bytes per frame a new session takes.
    mss: usize,
    /// Bytes a new session's receiver holds unread.
    window_bytes: usize,
    /// Where fresh flow ids and initial sequence numbers come from.
    random: fn() -> io::Result<u32>,
}

impl PortState {
    /// Shares the transmit buffers past the control reserve evenly among
    /// the sessions there are now, and the receive buffers too: each
    /// session's credit lets its peer have at most its share in flight, so
    /// that many senders into one port (a fan-in's server) cannot overrun
    /// its receive ring while its pump is away, which the kernel answers by
    /// dropping frames that must then be sent again.
    fn reshare(&mut self) {
        let sessions = self.table.sessions().max(1);
        self.io.share = self.io.tx_count().saturating_sub(CONTROL_RESERVE_FRAMES) / sessions;
        let cap = self.credit_cap(sessions);
        for slot in self.table.slots_mut() {
            slot.value.recv.cap_credit(cap);
        }
    }

    /// Each session's share of the receive buffers when there are
    /// `sessions`, in frames.
    fn credit_cap(&self, sessions: usize) -> u32 {
        let share = (self.io.tx_first as usize).saturating_sub(RX_RESERVE_FRAMES) / sessions.max(1);
        u32::try_from(share).unwrap_or(u32::MAX)
    }

    fn new_session(&mut self) -> io::Result<Session> {
        let isn = (self.random)()?;
        let tx = self.io.tx_count();
        // Capped for the sessions there will be with it, before its
        // opening announces a credit.
        let cap = self.credit_cap(self.table.sessions() + 1);
        Session::new(0, self.mss, self.window_bytes, isn, (tx, cap))
    }

    /// A fresh flow id, or why there is none.
    fn alloc_id(&mut self) -> io::Result<u16> {
        let mut draw_failed = None;
        let random = self.random;
        let id = self.table.alloc_id(|| match random() {
            Ok(v) => v as u16,
            Err(e) => {
                draw_failed = Some(e);
                1
            }
        });
        if let Some(e) = draw_failed {
            return Err(e);
        }
        id.map_err(io::Error::other)
    }

    /// Frames that reached the port and no session took, since it opened:
    /// the kernel's drops, frames for no session, and frames for a session
    /// from anyone but its peer or failing authentication.
    fn dropped_frames(&self) -> u64 {
        self.io
            .xsk
            .kernel_drops()
            .unwrap_or(0)
            .saturating_add(self.table.drops().unknown_flow_frames)
            .saturating_add(self.io.strays)
    }

    /// The session of flow `id` and the socket side.
    fn session(&mut self, id: u16) -> Result<(&mut PortIo, &mut Session), FlowError> {
        let i = self.table.index(id).ok_or_else(|| {
            FlowError::Io(io::Error::other(format!(
                "xdp flow {id} is no longer on its port (dropped as half-open)"
            )))
        })?;
        Ok((&mut self.io, &mut self.table.slot_mut(i).value))
    }

    /// One round of the port: completions, receptions (each into its
    /// session), timers, acknowledgments, the doorbell, then the waiters
    /// of every session that got something are woken. The clock is read
    /// only when frames arrived or `fresh_clock`, or after
    /// [`PUMPS_PER_CLOCK_READ`] pumps that did not (else the timers see
    /// the time of an earlier pump): a poll-mode waiter's spins.
    fn pump(&mut self, fresh_clock: bool) {
        let io = &mut self.io;
        // Nothing on the rings, nothing to ring the bell for and the timers
        // looked at lately: the pump would find nothing to do.
        if !fresh_clock
            && io.pumps_unclocked + 1 < PUMPS_PER_CLOCK_READ
            && !io.tx_queued
            && io.tx_outstanding == 0
            && !io.xsk.anything_arrived()
        {
            io.pumps_unclocked += 1;
            io.clock_read = false;
            return;
        }
        let mut slots = std::mem::take(&mut io.scratch_slots);
        io.reap_completions(&mut slots);
        // The clock is read when frames wait on the RX ring (their round
        // trips are timed) and every few idle pumps (for the timers), not
        // on every spin of a poll-mode waiter.
        let arriving = io.xsk.rx_waiting();
        io.pumps_unclocked += 1;
        io.clock_read = arriving || fresh_clock || io.pumps_unclocked >= PUMPS_PER_CLOCK_READ;
        if io.clock_read {
            io.now_cache_ns = io.now_ns();
            io.pumps_unclocked = 0;
        }
        let now = io.now_cache_ns;
        // Data for an open session is taken where it lies in the UMEM:
        // checked, authenticated and its payload copied once, into the
        // session's reassembly buffer; its acknowledgment fields wait in
        // `taken` for the second pass below, which needs the socket side
        // (to free and resend transmit buffers). Every other frame
        // (openings, acknowledgments, probes, frames for no open session)
        // is copied out whole for that pass. Both passes keep the order of
        // arrival.
        let mut bytes = std::mem::take(&mut io.scratch_frames);
        let mut taken = std::mem::take(&mut io.scratch_taken);
        bytes.clear();
        taken.clear();
        let table = &mut self.table;
        let mut strays = 0u64;
        io.xsk.receive(RX_BATCH, &mut slots, |frame| {
            // Only netgap's frames are looked at.
            if frame.len() < FRAME_OVERHEAD_BYTES
                || frame[12..14] != reliable::ETHERTYPE.to_be_bytes()
            {
                return;
            }
            let Ok(p) = reliable::parse(frame) else {
                return;
            };
            match take_data(table, &p, frame, now) {
                Take::Taken => taken.push(Pending::Taken(p.header)),
                Take::Dropped => strays += 1,
                Take::Later => {
                    bytes.extend_from_slice(frame);
                    taken.push(Pending::Copied(bytes.len()));
                }
            }
        });
        // Every receive buffer goes back (what it held was taken or copied
        // out above), a batch at a time.
        io.refill(&slots);
        io.scratch_slots = slots;
        io.strays += strays;
        self.second_pass(&bytes, &taken, now);
        self.io.scratch_frames = bytes;
        self.io.scratch_taken = taken;
        // Half-open sessions nobody confirmed in time go.
        if !self.table.expire(now).is_empty() {
            self.reshare();
        }
        self.run_timers(now);
        self.io.flush();
    }

    /// The pump's second pass, in order of arrival: the acknowledgment
    /// fields of the data taken in the first pass, and the frames copied
    /// out whole (`bytes`, each ending where its [`Pending::Copied`] says),
    /// routed to their sessions.
    #[inline]
    fn second_pass(&mut self, bytes: &[u8], taken: &[Pending], now: u64) {
        let mut start = 0;
        for pending in taken {
            match *pending {
                Pending::Taken(h) => {
                    if let Some(i) = self.table.index(h.dst_flow) {
                        let s = &mut self.table.slot_mut(i).value;
                        s.on_acknowledgment(&mut self.io, &h, now);
                    }
                }
                Pending::Copied(end) => {
                    let raw = &bytes[start..end];
                    start = end;
                    if let Ok(p) = reliable::parse(raw) {
                        self.route(&p.header, p.src, p.payload, raw, now);
                    }
                }
            }
        }
    }

    /// Runs every session's timers and wakes the waiters of those that
    /// something arrived for.
    #[inline]
    fn run_timers(&mut self, now: u64) {
        let io = &mut self.io;
        for slot in self.table.slots_mut() {
            let s = &mut slot.value;
            s.on_timers(io, now);
            if s.woken {
                s.woken = false;
                s.arrivals += 1;
                if s.cv_waiters > 0 {
                    s.signal.cv.notify_all();
                }
                if s.poller {
                    s.signal.ring();
                }
            }
        }
    }

    /// Moves one arrival to its session, or opens one for a SYN to a
    /// listener.
    fn route(&mut self, h: &Header, src: Mac, payload: &[u8], raw: &[u8], now: u64) {
        match self.table.route(src, h.kind, h.dst_flow, h.src_flow) {
            Route::Session(i) => {
                let s = &mut self.table.slot_mut(i).value;
                s.on_frame(&mut self.io, h, src, payload, raw, now);
            }
            Route::Open { listener } => {
                let (Ok(id), Ok(mut s)) = (self.alloc_id(), self.new_session()) else {
                    return;
                };
                s.local_flow = id;
                s.window_bytes = HALF_OPEN_WINDOW_BYTES.min(self.window_bytes);
                s.opened(h);
                s.peer = Some(Peer {
                    mac: src,
                    flow: h.src_flow,
                });
                s.side = Some(Side::Server);
                s.post(&mut self.io, Kind::SynAck, 0, &[], false);
                self.table
                    .insert_accepted(id, listener, (src, h.src_flow), now, s);
                self.reshare();
            }
            Route::Drop => {}
        }
    }
}

/// Which port: the interface's name in its network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortKey {
    /// The network namespace's inode (a process's threads may sit in
    /// different ones: a coordinator entering a testbed host's).
    pub netns: u64,
    /// The interface's name.
    pub ifname: String,
}

impl PortKey {
    /// The key of `ifname` in this thread's network namespace.
    pub(crate) fn here(ifname: &str) -> io::Result<PortKey> {
        use std::os::unix::fs::MetadataExt;
        let netns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
        Ok(PortKey {
            netns,
            ifname: ifname.to_string(),
        })
    }
}

/// The ports of the process, by interface: made on first use, gone when
/// their last flow or listener closes.
static PORTS: Mutex<Vec<(PortKey, Weak<Port>)>> = Mutex::new(Vec::new());

/// One AF_XDP socket shared by the process's xdp flows on an interface.
pub(crate) struct Port {
    st: Mutex<PortState>,
    fd: RawFd,
    /// The error of the last doorbell rung without the lock (0: none),
    /// for the next waiter to report.
    kick_errno: AtomicI32,
    attach: Attach,
    key: PortKey,
}

/// The port's lock, held: when it lets the lock go it rings the doorbell
/// the holder asked for ([`PortIo::flush`]).
pub(crate) struct PortGuard<'a> {
    st: Option<MutexGuard<'a, PortState>>,
    port: &'a Port,
}

impl<'a> PortGuard<'a> {
    /// The lock itself (for a condition variable's wait), with the
    /// doorbell rung first if asked for: the frames go before the sleep.
    fn into_inner(mut self) -> MutexGuard<'a, PortState> {
        let mut st = self.st.take().expect("a held guard");
        if std::mem::take(&mut st.io.kick_wanted) {
            if let Err(e) = st.io.xsk.kick() {
                self.record(&e);
            }
        }
        st
    }

    fn record(&self, e: &io::Error) {
        self.port
            .kick_errno
            .store(e.raw_os_error().unwrap_or(libc::EIO), Ordering::Relaxed);
    }
}

impl std::ops::Deref for PortGuard<'_> {
    type Target = PortState;
    fn deref(&self) -> &PortState {
        self.st.as_ref().expect("a held guard")
    }
}

impl std::ops::DerefMut for PortGuard<'_> {
    fn deref_mut(&mut self) -> &mut PortState {
        self.st.as_mut().expect("a held guard")
    }
}

impl Drop for PortGuard<'_> {
    fn drop(&mut self) {
        let Some(mut st) = self.st.take() else {
            return;
        };
        let ring = std::mem::take(&mut st.io.kick_wanted) && st.io.xsk.tx_needs_wakeup();
        drop(st);
        if ring {
            if let Err(e) = super::sys::ring_doorbell(self.port.fd) {
                self.record(&e);
            }
        }
    }
}

impl Port {
    /// The port of `key`, opened by `open` (the socket side, the payload
    /// per frame and the receive window of its sessions) if there is none.
    pub(crate) fn get(
        key: PortKey,
        open: impl FnOnce() -> io::Result<(PortIo, usize, usize)>,
        random: fn() -> io::Result<u32>,
    ) -> io::Result<Arc<Port>> {
        let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        ports.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = ports
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(p);
        }
        let (io, mss, window_bytes) = open()?;
        let fd = io.xsk.fd();
        let attach = io.xsk.attach();
        let port = Arc::new(Port {
            st: Mutex::new(PortState {
                io,
                table: Table::with_default_caps(),
                mss,
                window_bytes,
                random,
            }),
            fd,
            kick_errno: AtomicI32::new(0),
            attach,
            key: key.clone(),
        });
        ports.push((key, Arc::downgrade(&port)));
        Ok(port)
    }

    fn lock(&self) -> PortGuard<'_> {
        // A poisoned lock means a thread panicked mid-pump; the port's
        // state is still memory-safe, and its flows fail on their own
        // terms.
        PortGuard {
            st: Some(self.st.lock().unwrap_or_else(|e| e.into_inner())),
            port: self,
        }
    }

    /// The error of a doorbell rung without the lock, once.
    fn kick_error(&self) -> Result<(), FlowError> {
        match self.kick_errno.swap(0, Ordering::Relaxed) {
            0 => Ok(()),
            e => Err(FlowError::Io(io::Error::from_raw_os_error(e))),
        }
    }

    /// Pumps the port once, reading the clock; fails if a doorbell rung
    /// without the lock (this pump's or an earlier one's) failed.
    pub(crate) fn pump(&self) -> Result<(), FlowError> {
        // The guard rings the doorbell as it goes, before the error is read.
        self.lock().pump(true);
        self.kick_error()
    }

    /// Listens on a fresh flow id; returns it.
    pub(crate) fn listen(&self) -> io::Result<u16> {
        let mut st = self.lock();
        let id = st.alloc_id()?;
        st.table.listen(id);
        Ok(id)
    }

    /// Stops listening on `id`; the sessions nobody accepted close.
    pub(crate) fn unlisten(&self, id: u16) {
        let mut st = self.lock();
        for s in st.table.unlisten(id) {
            st.table.remove(s);
        }
        st.reshare();
    }

    /// The oldest session opened to listener `id`, if any, taken: its
    /// receive window grows to the port's full one (the next pump tells
    /// the peer).
    pub(crate) fn accept(&self, id: u16) -> Option<u16> {
        let mut st = self.lock();
        let sid = st.table.accept(id)?;
        let full = st.window_bytes;
        if let Ok((_, s)) = st.session(sid) {
            s.window_bytes = full;
            s.recv.grow_capacity(full);
        }
        Some(sid)
    }

    /// Opens a client session toward `peer` (its listening flow) and sends
    /// its opening; returns its flow id.
    pub(crate) fn open_session(&self, peer: Peer) -> Result<u16, FlowError> {
        let mut st = self.lock();
        let id = st.alloc_id().map_err(FlowError::Io)?;
        let mut s = st.new_session().map_err(FlowError::Io)?;
        s.local_flow = id;
        s.syn_to = Some(peer);
        s.post(&mut st.io, Kind::Syn, 0, &[], false);
        st.table.insert(id, s);
        st.reshare();
        st.io.flush();
        Ok(id)
    }

    /// Client side: sends session `id`'s opening again.
    pub(crate) fn syn_again(&self, id: u16) -> Result<(), FlowError> {
        let mut st = self.lock();
        let (io, s) = st.session(id)?;
        s.post(io, Kind::Syn, 0, &[], false);
        io.flush();
        Ok(())
    }

    /// Whether session `id` is open.
    pub(crate) fn connected(&self, id: u16) -> bool {
        let mut st = self.lock();
        st.session(id).is_ok_and(|(_, s)| s.connected())
    }

    /// Closes session `id` at once (a flow that never opened).
    pub(crate) fn remove(&self, id: u16) {
        let mut st = self.lock();
        st.table.remove(id);
        st.reshare();
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        ports.retain(|(k, w)| !(*k == self.key && w.strong_count() == 0));
    }
}

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
        let mut spins = 0u32;
        let mut first = true;
        let mut seen_arrivals = 0u64;
        loop {
            self.port.kick_error()?;
            let mut st = self.port.lock();
            // The first try goes before any pump: a send that has credit,
            // or a receive whose bytes are here, needs none.
            if first {
                first = false;
                let (io, s) = st.session(self.id)?;
                seen_arrivals = s.arrivals;
                if let Some(v) = attempt(io, s)? {
                    return Ok(v);
                }
            }
            // A fresh clock for every event-mode wake-up; a poll-mode spin
            // uses a recent pump's (the deadline starts at the first pump
            // that read it).
            st.pump(self.mode == Mode::Event);
            let (io, s) = st.session(self.id)?;
            if let Some(v) = attempt(io, s)? {
                return Ok(v);
            }
            if s.arrivals != seen_arrivals {
                seen_arrivals = s.arrivals;
                deadline_ns = None;
            }
            let now_ns = io.now_cache_ns;
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
                    spins += 1;
                    if spins.is_multiple_of(SPINS_PER_YIELD) {
                        std::thread::yield_now();
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
