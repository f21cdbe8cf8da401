//! The data path of the `xdp` transport: one endpoint (an AF_XDP socket
//! with its UMEM, [`Xsk`]) driven by the reliable-delivery state machines
//! of [`super::reliable`]. The application's threads do the work
//! themselves, as in VIA: a send copies payload into UMEM frames, posts
//! their descriptors on the TX ring and rings the doorbell; a receive
//! reaps the RX ring. Each call also reaps completions, refills the fill
//! ring, takes acknowledgments, resends what timed out and acknowledges
//! what arrived (one "pump" of the endpoint, under one lock, so the two
//! halves of a flow may run on two threads).
//!
//! Waiting: in `poll` mode a caller spins, pumping; in `event` mode one
//! waiting caller sleeps in poll() on the socket (and on an eventfd the
//! other half rings when its pump moved something this one waits for),
//! any other waits on a condition variable, woken by every pump that made
//! progress.
//!
//! UMEM layout: the first half of the frames are receive buffers (always
//! on the fill ring or the RX ring), the second half transmit buffers. A
//! data frame's buffer stays the sender's until the frame is acknowledged
//! (so it can be sent again as it is) and the kernel has completed every
//! send of it; a control frame's buffer is free once completed.
//!
//! Authentication: each end draws its initial sequence number at random;
//! once the session's data proof hands the flow its key
//! ([`XdpFlow::bind_session`]), every frame is sealed before it is queued
//! and every arrival from the peer must verify ([`super::auth::Guard`]);
//! one that does not is dropped and counted, and changes nothing.

use super::auth::{End, FrameKeys, Guard, Side};
use super::reliable::{
    self, AckOutcome, Arrival, Header, Kind, Mac, RecvWindow, SendWindow, FRAME_OVERHEAD_BYTES,
};
use super::sys::Xsk;
use crate::{DatagramStats, Flow, FlowError, FlowMonitor, Receiver, Sender};
use netgap_core::spec::Mode;
use netgap_proto::dataproof::FlowKey;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Receive frames reaped per pump at most.
const RX_BATCH: u32 = 64;
/// Spins between yields of the CPU while polling: rare, since a frame
/// that arrives during a yield (a system call) waits for it to return.
const SPINS_PER_YIELD: u32 = 1024;
/// Pumps that found nothing between clock reads: the timers they serve
/// (retransmission, probe, delayed acknowledgment) are milliseconds and
/// hundreds of microseconds long, a pump a fraction of a microsecond.
const PUMPS_PER_CLOCK_READ: u32 = 16;
/// Longest sleep of an event-mode waiter before it pumps again.
const MAX_SLEEP: Duration = Duration::from_millis(5);
/// How long a closing flow keeps sending what is unacknowledged.
const LINGER: Duration = Duration::from_millis(300);

/// The two ends' addresses of a flow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    /// The peer's MAC.
    pub mac: Mac,
    /// The peer's flow id.
    pub flow: u16,
}

/// Everything of one endpoint, behind the flow's lock.
pub(crate) struct Endpoint {
    xsk: Xsk,
    local_mac: Mac,
    local_flow: u16,
    peer: Option<Peer>,
    /// Payload bytes per frame this end sends: the smaller of its own and
    /// the peer's largest.
    mss: usize,
    /// Payload bytes per frame this end takes.
    recv_mss: usize,
    tx_first: u32,
    free_tx: Vec<u32>,
    /// Per transmit buffer: sends the kernel has not completed yet.
    tx_pending: Vec<u16>,
    /// Per transmit buffer: free once its sends complete (acknowledged
    /// data, or a control frame).
    tx_release: Vec<bool>,
    tx_queued: bool,
    /// Frames on the TX ring whose sending has not completed: the kernel
    /// sends a bounded batch per doorbell (32 in copy mode), so the bell
    /// rings again while any wait.
    tx_outstanding: u32,
    send: SendWindow,
    recv: RecvWindow,
    t0: Instant,
    stats: DatagramStats,
    /// A waiter sleeps in poll() on the socket and must be rung.
    poller: bool,
    /// Callers waiting on the condition variable (event mode): a pump
    /// notifies only when there is one, since a notification is a system
    /// call (a futex wake) even when nobody waits.
    cv_waiters: u32,
    /// The peer's flow id seen in a SYN (server side, before accept).
    syn_from: Option<Peer>,
    /// The peer asked for the flow's end and nothing more will come.
    fin_sent: bool,
    fin_seq: Option<u32>,
    /// The initial sequence number of what this end sends.
    isn: u32,
    /// The peer's initial sequence number, from its opening.
    peer_isn: u32,
    /// Which end of the flow this is, once it is open.
    side: Option<Side>,
    /// Bytes the receiver holds unread.
    window_bytes: usize,
    /// Seals what goes out and checks what comes in, once keyed.
    guard: Guard,
    /// The clock as the latest pump read it, ns since `t0`.
    now_cache_ns: u64,
    /// Pumps since the clock was last read.
    pumps_unclocked: u32,
    /// The latest pump read the clock (`now_cache_ns` is fresh).
    clock_read: bool,
    /// Scratch of the pump, kept so that it allocates nothing: slots
    /// completed or received, the bytes of the frames received and where
    /// each ends, and what an acknowledgment freed.
    scratch_slots: Vec<u32>,
    scratch_frames: Vec<u8>,
    scratch_ends: Vec<usize>,
    scratch_ack: AckOutcome,
}

impl Endpoint {
    /// An endpoint over `xsk` whose UMEM has `frames` frames, half for
    /// receiving; frames carry at most `mss` payload bytes, the receiver
    /// holds `window_bytes` unread, and what this end sends is numbered
    /// from `isn` (drawn at random).
    pub(crate) fn new(
        mut xsk: Xsk,
        frames: u32,
        (local_mac, local_flow): (Mac, u16),
        mss: usize,
        window_bytes: usize,
        isn: u32,
    ) -> io::Result<Endpoint> {
        let rx_frames = frames / 2;
        let rx: Vec<u32> = (0..rx_frames).collect();
        if xsk.fill(&rx) != rx.len() {
            return Err(io::Error::other("the fill ring took no receive buffers"));
        }
        let tx_count = frames - rx_frames;
        // Until the peer's opening names its initial sequence number.
        let recv = RecvWindow::new(0, mss, window_bytes);
        Ok(Endpoint {
            xsk,
            local_mac,
            local_flow,
            peer: None,
            mss,
            recv_mss: mss,
            tx_first: rx_frames,
            free_tx: (rx_frames..frames).rev().collect(),
            tx_pending: vec![0; tx_count as usize],
            tx_release: vec![false; tx_count as usize],
            tx_queued: false,
            tx_outstanding: 0,
            send: SendWindow::new(isn, 0, tx_count / 2),
            recv,
            t0: Instant::now(),
            stats: DatagramStats::default(),
            poller: false,
            cv_waiters: 0,
            syn_from: None,
            fin_sent: false,
            fin_seq: None,
            isn,
            peer_isn: 0,
            side: None,
            window_bytes,
            guard: Guard::new(),
            now_cache_ns: 0,
            pumps_unclocked: 0,
            clock_read: false,
            scratch_slots: Vec::with_capacity(RX_BATCH as usize),
            scratch_frames: Vec::new(),
            scratch_ends: Vec::with_capacity(RX_BATCH as usize),
            scratch_ack: AckOutcome::default(),
        })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// This end's flow id.
    pub(crate) fn local_flow(&self) -> u16 {
        self.local_flow
    }

    /// Takes flow id `flow` (a listener's replacement endpoint keeps the
    /// id it announced).
    pub(crate) fn set_local_flow(&mut self, flow: u16) {
        self.local_flow = flow;
    }

    fn tx_index(&self, slot: u32) -> Option<usize> {
        let i = slot.checked_sub(self.tx_first)? as usize;
        (i < self.tx_pending.len()).then_some(i)
    }

    /// Writes a frame of `kind` into a free transmit buffer and queues it;
    /// `None` when no buffer or ring entry is free. `keep` keeps the
    /// buffer after completion (a data frame, until acknowledged).
    fn post(&mut self, kind: Kind, seq: u32, payload: &[u8], keep: bool) -> Option<u32> {
        let peer = self.peer.or(self.syn_from)?;
        let slot = self.free_tx.pop()?;
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
        let local = self.local_mac;
        let frame = self.xsk.frame_mut(slot);
        let len = reliable::write_headers(frame, &peer.mac, &local, &header);
        frame[FRAME_OVERHEAD_BYTES..len].copy_from_slice(payload);
        self.guard.seal(&mut frame[..len]);
        let i = self.tx_index(slot)?;
        self.tx_release[i] = !keep;
        if !self.xsk.queue_tx(slot, len as u32) {
            self.free_tx.push(slot);
            return None;
        }
        self.tx_pending[i] = self.tx_pending[i].saturating_add(1);
        self.tx_queued = true;
        self.tx_outstanding += 1;
        if matches!(kind, Kind::Data | Kind::Fin) {
            self.stats.datagrams_sent += 1;
        }
        Some(slot)
    }

    /// Sends a kept data frame's buffer again, as it is (its header's
    /// acknowledgment fields are refreshed).
    fn resend(&mut self, slot: u32) {
        let Some(i) = self.tx_index(slot) else { return };
        let (ack, credit, sack) = self.recv.take_ack();
        let frame = self.xsk.frame_mut(slot);
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
        if self.xsk.queue_tx(slot, len as u32) {
            self.tx_pending[i] = self.tx_pending[i].saturating_add(1);
            self.tx_queued = true;
            self.tx_outstanding += 1;
            self.stats.datagrams_sent += 1;
            self.stats.retries += 1;
        }
    }

    fn release_if_done(&mut self, slot: u32) {
        if let Some(i) = self.tx_index(slot) {
            if self.tx_pending[i] == 0 && self.tx_release[i] {
                self.tx_release[i] = false;
                self.free_tx.push(slot);
            }
        }
    }

    /// One round of the endpoint: completions, receptions, timers,
    /// acknowledgments, the doorbell. Returns whether anything arrived.
    pub(crate) fn pump(&mut self) -> Result<bool, FlowError> {
        self.pump_clocked(true)
    }

    /// [`Endpoint::pump`], reading the clock only when frames arrived or
    /// `fresh_clock`, or after [`PUMPS_PER_CLOCK_READ`] pumps that did not
    /// (else the timers see the time of an earlier pump): a poll-mode
    /// waiter's spins.
    fn pump_clocked(&mut self, fresh_clock: bool) -> Result<bool, FlowError> {
        // Nothing on the rings, nothing to ring the bell for and the timers
        // looked at lately: the pump would find nothing to do.
        if !fresh_clock
            && self.pumps_unclocked + 1 < PUMPS_PER_CLOCK_READ
            && !self.tx_queued
            && self.tx_outstanding == 0
            && !self.xsk.anything_arrived()
        {
            self.pumps_unclocked += 1;
            self.clock_read = false;
            return Ok(false);
        }
        let mut slots = std::mem::take(&mut self.scratch_slots);
        self.xsk.completed(u32::MAX, &mut slots);
        for &slot in &slots {
            self.tx_outstanding = self.tx_outstanding.saturating_sub(1);
            if let Some(i) = self.tx_index(slot) {
                self.tx_pending[i] = self.tx_pending[i].saturating_sub(1);
                self.release_if_done(slot);
            }
        }
        // Whole frames are copied out (the authenticator covers the header
        // too), one after another into one kept buffer.
        let mut bytes = std::mem::take(&mut self.scratch_frames);
        let mut ends = std::mem::take(&mut self.scratch_ends);
        bytes.clear();
        ends.clear();
        self.xsk.receive(RX_BATCH, &mut slots, |frame| {
            // Only netgap's frames are kept (parsed whole below, once).
            if frame.len() >= FRAME_OVERHEAD_BYTES
                && frame[12..14] == reliable::ETHERTYPE.to_be_bytes()
            {
                bytes.extend_from_slice(frame);
                ends.push(bytes.len());
            }
        });
        let got = !slots.is_empty();
        if got {
            // Every receive buffer goes straight back: its bytes were
            // copied out above.
            self.xsk.fill(&slots);
            if self.xsk.fill_needs_wakeup() {
                let _ = self.xsk.kick();
            }
        }
        self.scratch_slots = slots;
        // The clock is read when frames arrived (their round trips are
        // timed) and every few idle pumps (for the timers), not on every
        // spin of a poll-mode waiter.
        self.pumps_unclocked += 1;
        self.clock_read = got || fresh_clock || self.pumps_unclocked >= PUMPS_PER_CLOCK_READ;
        if self.clock_read {
            self.now_cache_ns = self.now_ns();
            self.pumps_unclocked = 0;
        }
        let now = self.now_cache_ns;
        let mut start = 0;
        for &end in &ends {
            let raw = &bytes[start..end];
            start = end;
            if let Ok(p) = reliable::parse(raw) {
                self.on_frame(&p.header, p.src, p.payload, raw, now);
            }
        }
        self.scratch_frames = bytes;
        self.scratch_ends = ends;
        if self.peer.is_some() {
            for f in self.send.due(now) {
                self.resend(f.slot);
            }
            self.stats.retries = self.send.retransmits;
            if self.send.probe_due(now) {
                self.post(Kind::Probe, 0, &[], false);
            }
            if self.recv.ack_due(now) {
                self.post(Kind::Ack, 0, &[], false);
            }
        }
        self.flush()?;
        Ok(got)
    }

    fn flush(&mut self) -> Result<(), FlowError> {
        if self.tx_queued || self.tx_outstanding > 0 {
            self.tx_queued = false;
            self.xsk.kick().map_err(FlowError::Io)?;
        }
        Ok(())
    }

    /// Frames still wait on the TX ring for the doorbell.
    fn tx_backlog(&self) -> bool {
        self.tx_outstanding > 0
    }

    /// Takes frame `raw`, parsed as `h` from `src` with `payload`.
    fn on_frame(&mut self, h: &Header, src: Mac, payload: &[u8], raw: &[u8], now: u64) {
        if h.dst_flow != self.local_flow {
            return;
        }
        let Some(peer) = self.peer else {
            // Not connected yet: only the opening of a flow counts.
            match h.kind {
                Kind::Syn => {
                    self.syn_from = Some(Peer {
                        mac: src,
                        flow: h.src_flow,
                    });
                    self.opened(h);
                }
                // The answer of the server this end asked, to this end's
                // opening (its initial sequence number echoed).
                Kind::SynAck
                    if h.ack == self.isn
                        && self
                            .syn_from
                            .is_some_and(|p| p.mac == src && p.flow == h.src_flow) =>
                {
                    self.opened(h);
                    self.peer = self.syn_from;
                    self.side = Some(Side::Client);
                }
                _ => {}
            }
            return;
        };
        if h.src_flow != peer.flow || src != peer.mac {
            return;
        }
        if !self.guard.admit(raw) {
            // Not the peer's (or altered on the way): as if never arrived.
            return;
        }
        match h.kind {
            Kind::Syn => {
                // Our SYN-ACK was lost: say it again (to the same opening
                // only).
                if h.seq == self.peer_isn {
                    self.post(Kind::SynAck, 0, &[], false);
                }
                return;
            }
            Kind::SynAck => return,
            Kind::Data | Kind::Fin => {
                self.stats.datagrams_received += 1;
                let arrival = self.recv.on_frame(h.seq, payload, h.kind == Kind::Fin, now);
                if arrival == Arrival::Duplicate {
                    self.stats.duplicates += 1;
                }
            }
            Kind::Probe => self.recv.on_probe(),
            Kind::Ack => {}
        }
        let mut out = std::mem::take(&mut self.scratch_ack);
        self.send
            .on_ack_into(h.ack, h.credit, h.sack, now, &mut out);
        for &slot in &out.freed {
            if let Some(i) = self.tx_index(slot) {
                self.tx_release[i] = true;
                self.release_if_done(slot);
            }
        }
        for f in &out.resend {
            self.resend(f.slot);
        }
        self.scratch_ack = out;
    }

    /// Takes the peer's opening `h`: its initial sequence number, the
    /// credit it gives and the payload it takes.
    fn opened(&mut self, h: &Header) {
        self.peer_isn = h.seq;
        self.send = SendWindow::new(self.isn, h.credit, self.send_buffers());
        self.recv = RecvWindow::new(h.seq, self.recv_mss, self.window_bytes);
        self.mss = peer_mss(u32::try_from(h.sack).unwrap_or(u32::MAX), self.recv_mss);
    }

    /// Keys the open flow with the proven connection's `key`: from now on
    /// every frame is sealed and every arrival must verify.
    fn bind(&mut self, key: &FlowKey) -> Result<(), FlowError> {
        let (Some(peer), Some(side)) = (self.peer, self.side) else {
            return Err(FlowError::Io(io::Error::other(
                "an xdp flow can be keyed only once it is open",
            )));
        };
        let local = End {
            mac: self.local_mac,
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

    fn send_buffers(&self) -> u32 {
        (self.tx_pending.len() / 2).max(1) as u32
    }

    /// Client side: sends (again) the flow's opening to `peer`.
    pub(crate) fn syn(&mut self, peer: Peer) -> Result<(), FlowError> {
        self.syn_from = Some(peer);
        self.post(Kind::Syn, 0, &[], false);
        self.flush()
    }

    /// Server side: the peer whose SYN arrived, if one did; accepts it.
    pub(crate) fn accept_syn(&mut self) -> Result<bool, FlowError> {
        let Some(p) = self.syn_from else {
            return Ok(false);
        };
        self.peer = Some(p);
        self.side = Some(Side::Server);
        self.post(Kind::SynAck, 0, &[], false);
        self.flush()?;
        Ok(true)
    }

    /// Whether the flow is open (the handshake is done).
    pub(crate) fn connected(&self) -> bool {
        self.peer.is_some()
    }

    /// Sends as much of `buf` as credit and buffers allow; returns the
    /// bytes taken.
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let mut taken = 0;
        // One clock read for the frames of one call: they go out together.
        let now = self.now_ns();
        while taken < buf.len() && self.send.may_send() && !self.free_tx.is_empty() {
            let end = (taken + self.mss).min(buf.len());
            let seq = self.send.next_seq();
            let Some(slot) = self.post(Kind::Data, seq, &buf[taken..end], true) else {
                break;
            };
            self.send.push(slot, now);
            taken = end;
        }
        if taken > 0 {
            self.flush()?;
        }
        Ok(taken)
    }

    /// Sends the end of this end's stream once, when credit allows.
    fn send_fin(&mut self) -> Result<(), FlowError> {
        if self.fin_sent || !self.send.may_send() || self.free_tx.is_empty() {
            return Ok(());
        }
        let seq = self.send.next_seq();
        if let Some(slot) = self.post(Kind::Fin, seq, &[], true) {
            let now = self.now_ns();
            self.send.push(slot, now);
            self.fin_sent = true;
            self.fin_seq = Some(seq);
        }
        self.flush()
    }

    /// When the next timer (a retransmission, a probe, a delayed
    /// acknowledgment) falls due, as a duration from now.
    fn next_timer(&self) -> Option<Duration> {
        let at = match (self.send.next_deadline_ns(), self.recv.ack_deadline_ns()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(Duration::from_nanos(at.saturating_sub(self.now_ns())))
    }
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

/// An endpoint shared by the two halves of a flow and its monitor.
pub(crate) struct Shared {
    ep: Mutex<Endpoint>,
    cv: Condvar,
    fd: RawFd,
    bell: OwnedFd,
    mode: Mode,
    timeout: Duration,
    /// Where the endpoint's program is attached; fixed for its life.
    attach: super::sys::Attach,
}

impl Shared {
    /// Shares `ep` for a flow of `mode` with inactivity timeout `timeout`.
    pub(crate) fn new(ep: Endpoint, mode: Mode, timeout: Duration) -> io::Result<Arc<Shared>> {
        let fd = ep.xsk.fd();
        let attach = ep.xsk.attach();
        // SAFETY: eventfd with no initial count and valid flags; the result
        // is checked and owned at once.
        let bell = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if bell < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Shared {
            ep: Mutex::new(ep),
            cv: Condvar::new(),
            fd,
            // SAFETY: `bell` is a new descriptor nothing else owns.
            bell: unsafe { OwnedFd::from_raw_fd(bell) },
            mode,
            timeout,
            attach,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Endpoint> {
        // A poisoned lock means a thread panicked mid-pump; the endpoint's
        // state is still memory-safe, and the flow fails on its own terms.
        self.ep.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pumps under the lock and wakes whoever waits if anything arrived.
    fn pump(&self, ep: &mut Endpoint) -> Result<bool, FlowError> {
        self.pump_clocked(ep, true)
    }

    /// [`Shared::pump`], the clock read as [`Endpoint::pump_clocked`] says.
    fn pump_clocked(&self, ep: &mut Endpoint, fresh_clock: bool) -> Result<bool, FlowError> {
        let got = ep.pump_clocked(fresh_clock)?;
        if got {
            if ep.cv_waiters > 0 {
                self.cv.notify_all();
            }
            if ep.poller {
                self.ring();
            }
        }
        Ok(got)
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

    fn drain_bell(&self) {
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

    /// Runs `attempt` (under the lock, after a pump) until it returns
    /// `Some`, waiting as the mode says; fails after `timeout` without
    /// progress.
    pub(crate) fn wait_for<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut(&mut Endpoint) -> Result<Option<T>, FlowError>,
    ) -> Result<T, FlowError> {
        // The deadline is on the endpoint's clock as its pumps read it
        // (every few spins), so waiting adds no clock read of its own.
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut deadline_ns: Option<u64> = None;
        let mut spins = 0u32;
        let mut first = true;
        loop {
            let mut ep = self.lock();
            // The first try goes before any pump: a send that has credit,
            // or a receive whose bytes are here, needs none.
            if first {
                first = false;
                if let Some(v) = attempt(&mut ep)? {
                    return Ok(v);
                }
            }
            // A fresh clock for every event-mode wake-up; a poll-mode spin
            // uses a recent pump's (the deadline starts at the first pump
            // that read it).
            let got = self.pump_clocked(&mut ep, self.mode == Mode::Event)?;
            if let Some(v) = attempt(&mut ep)? {
                return Ok(v);
            }
            if got {
                deadline_ns = None;
            }
            let now_ns = ep.now_cache_ns;
            let dl = match deadline_ns {
                Some(dl) => dl,
                None if ep.clock_read => *deadline_ns.insert(now_ns.saturating_add(timeout_ns)),
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
                    drop(ep);
                    spins += 1;
                    if spins.is_multiple_of(SPINS_PER_YIELD) {
                        std::thread::yield_now();
                    }
                }
                // Frames still wait on the TX ring: ring again, not sleep.
                Mode::Event if ep.tx_backlog() => drop(ep),
                Mode::Event => {
                    let sleep = ep
                        .next_timer()
                        .unwrap_or(MAX_SLEEP)
                        .min(MAX_SLEEP)
                        .min(Duration::from_nanos(dl - now_ns));
                    if ep.poller {
                        ep.cv_waiters += 1;
                        let (mut ep, _) = self
                            .cv
                            .wait_timeout(ep, sleep)
                            .unwrap_or_else(|e| e.into_inner());
                        ep.cv_waiters -= 1;
                    } else {
                        ep.poller = true;
                        drop(ep);
                        self.sleep_in_poll(sleep);
                        self.lock().poller = false;
                    }
                }
            }
        }
    }

    /// Sleeps until a frame arrives, the other half rings, or `max` passes.
    fn sleep_in_poll(&self, max: Duration) {
        let ms = libc::c_int::try_from(max.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        let mut fds = [
            libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.bell.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd structs.
        let _ = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if fds[1].revents != 0 {
            self.drain_bell();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Linger: let what is unacknowledged arrive, then say the stream
        // ended, so the peer's receive ends instead of timing out.
        let shared_mode = self.mode;
        let ep = self.ep.get_mut().unwrap_or_else(|e| e.into_inner());
        if !ep.connected() {
            return;
        }
        let t0 = Instant::now();
        while t0.elapsed() < LINGER {
            if ep.pump().is_err() {
                return;
            }
            if !ep.fin_sent {
                if ep.send_fin().is_err() {
                    return;
                }
            } else if ep.send.idle() {
                break;
            }
            match shared_mode {
                Mode::Poll => std::hint::spin_loop(),
                Mode::Event => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
}

/// One half of an xdp flow.
pub(crate) struct Half {
    shared: Arc<Shared>,
}

impl Sender for Half {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let timeout = self.shared.timeout;
        self.shared.wait_for(timeout, |ep| {
            let n = ep.send_some(buf)?;
            Ok((n > 0).then_some(n))
        })
    }
}

impl Receiver for Half {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        let timeout = self.shared.timeout;
        self.shared.wait_for(timeout, |ep| {
            if ep.recv.ready_bytes() > 0 {
                let n = ep.recv.read(buf);
                let now = ep.now_ns();
                if ep.recv.ack_due(now) {
                    // Reading opened room: tell a sender waiting for
                    // credit.
                    ep.post(Kind::Ack, 0, &[], false);
                    ep.flush()?;
                }
                return Ok(Some(n));
            }
            if ep.recv.finished() {
                return Err(FlowError::Closed);
            }
            Ok(None)
        })
    }

    fn ready_bytes(&self) -> Option<u64> {
        let mut ep = self.shared.lock();
        let _ = self.shared.pump(&mut ep);
        Some(ep.recv.ready_bytes() as u64)
    }
}

/// An open xdp flow.
pub(crate) struct XdpFlow {
    tx: Half,
    rx: Half,
    shared: Arc<Shared>,
}

impl XdpFlow {
    /// The flow over a connected endpoint.
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
        }))
    }

    fn path_choices(&self) -> Vec<String> {
        // Native and generic XDP are different paths through the kernel:
        // the generic hook runs after the socket buffer is built.
        vec![format!("xdp_attach={}", self.shared.attach.name())]
    }

    fn bind_session(&mut self, key: &FlowKey) -> Result<(), FlowError> {
        self.shared.lock().bind(key)
    }
}

/// The counters and the idle upkeep of an xdp flow: its frames sent,
/// received and sent again, and acknowledgments and retransmissions while
/// the test is idle. Holds the endpoint weakly, so the flow still closes
/// when the test drops it.
struct Monitor {
    shared: std::sync::Weak<Shared>,
}

impl FlowMonitor for Monitor {
    fn datagram_stats(&self) -> DatagramStats {
        self.shared
            .upgrade()
            .map(|s| s.lock().stats)
            .unwrap_or_default()
    }

    fn serve_idle(&self, wake: BorrowedFd<'_>, max_wait: Duration) -> Result<(), FlowError> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        let t0 = Instant::now();
        loop {
            {
                let mut ep = shared.lock();
                shared.pump(&mut ep)?;
            }
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
                    fd: shared.fd,
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
