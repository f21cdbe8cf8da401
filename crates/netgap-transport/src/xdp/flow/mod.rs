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

mod fixed;
mod halves;
mod session;

pub(crate) use fixed::{FixedOpening, FixedState};
pub(crate) use halves::{Shared, XdpFlow};

/// Receive frames reaped per pump at most.
const RX_BATCH: u32 = 64;
/// Receive buffers given back to the fill ring together. Filling reads the
/// kernel's consumer index, which the other CPU writes on every arrival (a
/// cache miss each time): in batches, one miss serves many buffers. The
/// kernel keeps all but fewer than this many of the port's receive buffers
/// meanwhile.
const FILL_BATCH: usize = 32;
/// How long a poll-mode waiter spins before it yields the CPU, ns (and
/// between yields after that). A yield is a system call, and on a busy
/// host it hands the CPU to other work for a whole time slice, so it must
/// not come in an ordinary wait: a round trip on an unshaped link is some
/// 10 µs, and a count of spins (1,024) yielded in about one wait in four
/// of a 1-byte ping-pong on the testbed link (31,000 yields in 110,000
/// round trips) and some 9,000 times a second in a stream's receiver. A
/// waiter that long without a frame waits on something the CPU may as
/// well do (another thread of the flow, or the peer on the same CPU).
const YIELD_AFTER_NS: u64 = 100_000;
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
    /// Data frames went with a provisional time: the next pump reads the
    /// clock and gives them its time (see [`Session::send_some`]).
    stamps_due: bool,
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
            stamps_due: false,
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
    /// The latest authenticated frame from the peer, or the start of a
    /// wait for one, on the port's clock (ns): a session whose ids were
    /// fixed gives up on a peer silent for too long.
    heard_ns: u64,
    /// The application shut its sending down: the closing frame goes as
    /// soon as credit allows.
    fin_wanted: bool,
    /// The opening's rules of a session whose ids were fixed before it
    /// opened (a direct connection); `None` for a flow opened through a
    /// listener.
    fixed: Option<fixed::Fixed>,
    /// The first of the data frames sent with a provisional time (the
    /// port's latest clock read) and not yet given a time read after they
    /// were queued ([`SendWindow::stamp_from`]), if any.
    unstamped_from: Option<u32>,
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
    if s.fixed.is_some_and(|f| f.ended()) {
        // Nothing is taken after a reset: the second pass answers it.
        return Take::Later;
    }
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
    /// A poll-mode receive's pump left its second half for later
    /// ([`PortState::pump_for`]): the time it read, its frames' fields in
    /// the pump's scratch. Whoever takes the lock next finishes it first,
    /// but for the receiver's own next send, which finishes it after its
    /// doorbell.
    deferred_ns: Option<u64>,
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
    /// when `fresh_clock`, when data frames sent since the last pump wait
    /// for their time, or after [`PUMPS_PER_CLOCK_READ`] pumps that did
    /// not read it; else the pump works on the time of an earlier one.
    ///
    /// Every caller that starts pumping (a wait's first pump, a pump on its
    /// own) passes `fresh_clock`, so the time a frame is taken at is at
    /// most [`PUMPS_PER_CLOCK_READ`] pumps of the same wait old: a few µs
    /// of spinning, against timers of hundreds of µs and more. Frames that
    /// arrive are not worth a read of their own: in a ping-pong it would
    /// stand between the frame and the reply (36 ns a read on the 2-vCPU
    /// KVM guest of BENCHMARKS.md, four of them a round trip with the
    /// sends' ones), while the read this wait began with came as it
    /// waited anyway.
    fn pump(&mut self, fresh_clock: bool) {
        self.finish_deferred();
        if let Some(now) = self.pump_front(fresh_clock) {
            self.pump_back(now);
        }
    }

    /// [`PortState::pump`] for a poll-mode waiter of session `id`: when all
    /// that arrived is data for that session, the second half (the
    /// acknowledgments the frames carry, the timers, the other sessions'
    /// wake-ups) waits until the waiter has its bytes and has answered
    /// (see [`PortState::deferred_ns`]), so that neither stands between a
    /// frame and the program: about 100 cycles (40 ns) a message at each
    /// end of a ping-pong on the 2-vCPU guest of BENCHMARKS.md. Anything
    /// else that arrived is taken at once, as by `pump`.
    fn pump_for(&mut self, id: u16, fresh_clock: bool) {
        self.finish_deferred();
        let Some(now) = self.pump_front(fresh_clock) else {
            return;
        };
        let only_ours = !self.io.scratch_taken.is_empty()
            && self
                .io
                .scratch_taken
                .iter()
                .all(|p| matches!(p, Pending::Taken(h) if h.dst_flow == id));
        if only_ours {
            self.deferred_ns = Some(now);
        } else {
            self.pump_back(now);
        }
    }

    /// Finishes a pump whose second half was left for later, if any.
    fn finish_deferred(&mut self) {
        if let Some(now) = self.deferred_ns.take() {
            self.pump_back(now);
        }
    }

    /// The first half of a pump: completions, the clock, the receptions
    /// (data taken into its sessions, every other frame copied out, all of
    /// them in the scratch for [`PortState::pump_back`]). Returns the
    /// pump's time, or None when there was nothing to do.
    fn pump_front(&mut self, fresh_clock: bool) -> Option<u64> {
        let io = &mut self.io;
        // Nothing on the rings, nothing to ring the bell for and the timers
        // looked at lately: the pump would find nothing to do.
        if !fresh_clock
            && !io.stamps_due
            && io.pumps_unclocked + 1 < PUMPS_PER_CLOCK_READ
            && !io.tx_queued
            && io.tx_outstanding == 0
            && !io.xsk.anything_arrived()
        {
            io.pumps_unclocked += 1;
            io.clock_read = false;
            return None;
        }
        let mut slots = std::mem::take(&mut io.scratch_slots);
        io.reap_completions(&mut slots);
        io.pumps_unclocked += 1;
        io.clock_read = fresh_clock || io.stamps_due || io.pumps_unclocked >= PUMPS_PER_CLOCK_READ;
        if io.clock_read {
            io.now_cache_ns = io.now_ns();
            io.pumps_unclocked = 0;
        }
        let now = io.now_cache_ns;
        // Before anything reads the frames' times (acknowledgments,
        // timers): the frames sent since the last pump get this one's.
        if std::mem::take(&mut io.stamps_due) {
            for slot in self.table.slots_mut() {
                slot.value.stamp_sends(now);
            }
        }
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
        io.scratch_frames = bytes;
        io.scratch_taken = taken;
        Some(now)
    }

    /// The second half of a pump of time `now`: the frames' fields
    /// (`pump_front`'s scratch) to their sessions, the timers, the
    /// doorbell asked for, the waiters woken.
    fn pump_back(&mut self, now: u64) {
        let bytes = std::mem::take(&mut self.io.scratch_frames);
        let taken = std::mem::take(&mut self.io.scratch_taken);
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
    /// Where the process's ports list it; `None` for a port of one
    /// connection's own ([`Port::alone`]), which no other flow shares.
    key: Option<PortKey>,
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
        st.finish_deferred();
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
        // A receive's pump left for later is finished once an answer has
        // gone (after its doorbell, while the frame travels), not on the
        // way to the program with its bytes.
        let finish = ring && st.deferred_ns.is_some();
        drop(st);
        if ring {
            if let Err(e) = super::sys::ring_doorbell(self.port.fd) {
                self.record(&e);
            }
        }
        if finish {
            // The guard of this finish rings what it queued.
            self.port.lock();
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
        let port = Port::new(io, mss, window_bytes, random, Some(key.clone()));
        ports.push((key, Arc::downgrade(&port)));
        Ok(port)
    }

    /// A port over `io` (payload `mss` bytes a frame, a receive window of
    /// `window_bytes`) with no sessions yet; `key` says where the
    /// process's ports list it, `None` for a port of one connection's own.
    fn new(
        io: PortIo,
        mss: usize,
        window_bytes: usize,
        random: fn() -> io::Result<u32>,
        key: Option<PortKey>,
    ) -> Arc<Port> {
        let fd = io.xsk.fd();
        let attach = io.xsk.attach();
        Arc::new(Port {
            st: Mutex::new(PortState {
                io,
                table: Table::with_default_caps(),
                mss,
                window_bytes,
                random,
                deferred_ns: None,
            }),
            fd,
            kick_errno: AtomicI32::new(0),
            attach,
            key,
        })
    }

    fn lock(&self) -> PortGuard<'_> {
        let mut guard = self.lock_deferred();
        guard.finish_deferred();
        guard
    }

    /// The lock, a pump left for later still left ([`PortState::pump_for`]):
    /// for a waiter's first try, a send that goes before it.
    fn lock_deferred(&self) -> PortGuard<'_> {
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
        // A plain load first: every spin of a waiter asks, and an atomic
        // swap is a locked instruction even when there is nothing to take.
        if self.kick_errno.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
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
        // A port of its own was never listed: its drop takes no lock (it
        // may run in a forked child, where another thread of the parent
        // held the list's lock at the fork).
        let Some(key) = &self.key else { return };
        let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        ports.retain(|(k, w)| !(k == key && w.strong_count() == 0));
    }
}
