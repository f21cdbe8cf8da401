//! One worker's loop: it starts every flow, waits in epoll, hands each
//! ready flow to the handler of its kind (round trips, connections), and
//! watches for flows that stopped making progress.

use super::datagrams::{datagram_ready, datagram_start, resend_due};
use super::{
    new_socket, sys, Ctx, Finished, Flow, Kind, Schedule, Worker, ABORTED, RETRY_DELAY, TICK_MS,
};
use crate::flows::buffers::WorkerBuffers;
use crate::flows::io::{Io, WorkerIo};
use crate::flows::machine::{MachineError, Progress};
use crate::flows::proof::ConnectorHandshake;
use crate::flows::{EngineError, FlowOutcome};
use netgap_core::spec::Mode;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs one worker's flows from the start of warm-up until every flow has
/// stopped after the window.
pub(super) fn run_worker(
    mut w: Worker,
    sched: Schedule,
    ctx: &Ctx,
    abort: &AtomicBool,
) -> Result<Vec<Finished>, EngineError> {
    let mut retries: VecDeque<(Instant, usize)> = VecDeque::new();
    let mut last_error: Option<String> = None;
    let now = Instant::now();
    for slot in 0..w.flows.len() {
        begin(&mut w, slot, now, sched, ctx, &mut retries, &mut last_error)?;
    }
    let mut events = vec![EpollEvent::empty(); 1024];
    let mut next_scan = now + Duration::from_millis(TICK_MS);
    loop {
        if abort.load(Ordering::Relaxed) {
            return Err(EngineError::Invalid(ABORTED.into()));
        }
        let now = Instant::now();
        let stopping = now >= sched.end;
        if stopping {
            // No new connection after the window.
            retries.clear();
            if !w.flows.iter().any(Flow::busy) {
                break;
            }
        }
        let mut wake = next_scan;
        if !stopping {
            wake = wake.min(sched.end);
        }
        if let Some(&(at, _)) = retries.front() {
            wake = wake.min(at);
        }
        if let Some(at) = w.retries.next_due() {
            wake = wake.min(at);
        }
        // Ahead of the rate budget: sleep it off (a tick at most, so the
        // timeouts, the schedule and the abort are still seen).
        crate::flows::io::wait_for_budget(
            ctx.rate.as_deref(),
            abort,
            Duration::from_millis(TICK_MS),
        );
        let timeout_ms = wake
            .saturating_duration_since(now)
            .as_millis()
            .min(u128::from(TICK_MS));
        // Round up so the wake-up is not early and spinning; poll mode
        // spins on purpose.
        let timeout_ms = match ctx.mode {
            Mode::Event => u16::try_from(timeout_ms + 1).unwrap_or(u16::MAX),
            Mode::Poll => 0,
        };
        let n = match w.epoll.wait(&mut events, timeout_ms) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => return Err(sys("waiting in epoll", e)),
        };
        for ev in &events[..n] {
            let slot = ev.data() as usize;
            if slot < w.flows.len() {
                on_ready(&mut w, slot, sched, ctx, &mut retries, &mut last_error)?;
            }
            // The rest stay ready (level-triggered) for after the wait.
            if crate::flows::io::ahead(ctx.rate.as_deref()) {
                break;
            }
        }
        let now = Instant::now();
        resend_due(&mut w, now, ctx)?;
        while let Some(&(at, slot)) = retries.front() {
            if at > now {
                break;
            }
            retries.pop_front();
            begin(&mut w, slot, now, sched, ctx, &mut retries, &mut last_error)?;
        }
        if now >= next_scan {
            next_scan = now + Duration::from_millis(TICK_MS);
            check_stalled(&mut w, now, sched, ctx, &mut retries, &mut last_error)?;
        }
    }
    Ok(finish(w.flows, last_error))
}

/// Ends or counts the flows that made no progress for the I/O timeout: a
/// stalled round trip fails the run; a stalled connection is dropped,
/// counted, and retried after [`RETRY_DELAY`] while the window lasts.
fn check_stalled(
    w: &mut Worker,
    now: Instant,
    sched: Schedule,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) -> Result<(), EngineError> {
    for slot in 0..w.flows.len() {
        let f = &mut w.flows[slot];
        if !f.busy() || now.duration_since(f.last_progress) < ctx.io_timeout {
            continue;
        }
        match &mut f.kind {
            Kind::PingPong { .. } | Kind::Datagram { .. } => {
                return Err(EngineError::FlowStalled {
                    index: f.index,
                    target: ctx.target,
                    timeout: ctx.io_timeout,
                })
            }
            Kind::Connect { stream, .. } => {
                *stream = None;
                f.interest = None;
                f.errors += 1;
                *last_error = Some(format!("no progress for {:?}", ctx.io_timeout));
                if now < sched.end {
                    retries.push_back((now + RETRY_DELAY, slot));
                }
            }
        }
    }
    Ok(())
}

/// The worker's flows' outcomes, in its order; the worker's last connection
/// failure goes with its first flow.
fn finish(flows: Vec<Flow>, mut last_error: Option<String>) -> Vec<Finished> {
    flows
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let (bytes_tx, bytes_rx, datagrams) = match &f.kind {
                Kind::PingPong { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, None),
                Kind::Connect { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, None),
                Kind::Datagram { m, .. } => (m.moved.tx_bytes, m.moved.rx_bytes, Some(m.stats)),
            };
            Finished {
                index: f.index,
                completed: f.completed,
                // One copy per worker is enough to report the last failure.
                last_error: if i == 0 { last_error.take() } else { None },
                outcome: FlowOutcome {
                    index: f.index,
                    round_trips: f.round_trips,
                    bytes_tx,
                    bytes_rx,
                    window_bytes_tx: f.window_bytes_tx,
                    window_bytes_rx: f.window_bytes_rx,
                    hist: f.hist,
                    errors: f.errors,
                    datagrams,
                    window_setup_ns: f.window_setup_ns,
                },
            }
        })
        .collect()
}

/// Starts the flow's first exchange: a round trip, or a connection.
fn begin(
    w: &mut Worker,
    slot: usize,
    now: Instant,
    sched: Schedule,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) -> Result<(), EngineError> {
    match w.flows[slot].kind {
        Kind::Connect { .. } => {
            open_connection(w, slot, now, ctx, retries, last_error);
            return Ok(());
        }
        Kind::Datagram { .. } => return datagram_start(w, slot, now, ctx),
        Kind::PingPong { .. } => {}
    }
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let progress = m
        .start(&mut Io::new(stream.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    pingpong_advance(epoll, &mut **io, bufs, f, slot, progress, sched, ctx)
}

pub(super) fn flow_failed(index: u32, ctx: &Ctx, e: MachineError) -> EngineError {
    EngineError::FlowFailed {
        index,
        target: ctx.target,
        reason: e.to_string(),
    }
}

/// Opens the next connection of a connect-mode flow; a failure is counted
/// and retried after [`RETRY_DELAY`].
fn open_connection(
    w: &mut Worker,
    slot: usize,
    now: Instant,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) {
    let f = &mut w.flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::Connect {
        stream,
        connecting,
        proof,
        timed,
        ..
    } = &mut f.kind
    else {
        return;
    };
    *proof = None;
    let opened = new_socket(ctx.target, ctx.bind_ip, ctx.transport, &ctx.options).and_then(|s| {
        s.set_nonblocking(true)?;
        match s.connect(&ctx.target.into()) {
            Ok(()) => Ok(s),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
            Err(e) => Err(e),
        }
    });
    match opened {
        Ok(s) => {
            let s: TcpStream = s.into();
            match w
                .epoll
                .add(&s, EpollEvent::new(EpollFlags::EPOLLOUT, slot as u64))
            {
                Ok(()) => {
                    f.interest = Some(EpollFlags::EPOLLOUT);
                    *stream = Some(s);
                    *connecting = true;
                    *timed = false;
                }
                Err(e) => {
                    f.errors += 1;
                    *last_error = Some(format!("adding a connection to epoll: {e}"));
                    retries.push_back((now + RETRY_DELAY, slot));
                }
            }
        }
        Err(e) => {
            f.errors += 1;
            *last_error = Some(e.to_string());
            retries.push_back((now + RETRY_DELAY, slot));
        }
    }
}

/// The latency from `t0` to `now`, ns.
pub(super) fn elapsed_ns(t0: Instant, now: Instant) -> u64 {
    u64::try_from(now.duration_since(t0).as_nanos()).unwrap_or(u64::MAX)
}

/// Handles readiness of the flow in `slot`.
fn on_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
    retries: &mut VecDeque<(Instant, usize)>,
    last_error: &mut Option<String>,
) -> Result<(), EngineError> {
    let reopen = match w.flows[slot].kind {
        Kind::PingPong { .. } => return pingpong_ready(w, slot, sched, ctx),
        Kind::Datagram { .. } => return datagram_ready(w, slot, sched, ctx),
        Kind::Connect { .. } => connect_ready(w, slot, sched, ctx, last_error),
    };
    match reopen {
        Reopen::No => {}
        Reopen::Now(now) => open_connection(w, slot, now, ctx, retries, last_error),
        Reopen::Later(now) => retries.push_back((now + RETRY_DELAY, slot)),
    }
    Ok(())
}

/// What a connect-mode flow does after an event.
enum Reopen {
    /// Nothing: the connection goes on, or the run is over.
    No,
    /// The connection finished: open the next one at once.
    Now(Instant),
    /// The connection failed: open the next one after [`RETRY_DELAY`].
    Later(Instant),
}

fn pingpong_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let progress = m
        .pump(&mut Io::new(stream.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    pingpong_advance(epoll, &mut **io, bufs, f, slot, progress, sched, ctx)
}

/// Acts on a pingpong flow's `progress`: records a finished round trip and
/// starts the next one (which on a fast path may itself finish at once, so
/// this loops), then sets the epoll interest to what the flow waits for.
#[allow(
    clippy::too_many_arguments,
    reason = "the worker's parts a flow's progress touches, borrowed apart from its flows"
)]
fn pingpong_advance(
    epoll: &Epoll,
    io: &mut dyn WorkerIo,
    bufs: &mut WorkerBuffers,
    f: &mut Flow,
    slot: usize,
    mut progress: Progress,
    sched: Schedule,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Kind::PingPong { stream, m } = &mut f.kind else {
        return Ok(());
    };
    let want = loop {
        let now = Instant::now();
        f.last_progress = now;
        match progress {
            Progress::WantRead => break EpollFlags::EPOLLIN,
            Progress::WantWrite => break EpollFlags::EPOLLOUT,
            Progress::Done => {
                if sched.in_window(now) {
                    let size = m.size_bytes() as u64;
                    f.hist.record_ns(elapsed_ns(f.t0, now));
                    f.round_trips += 1;
                    f.window_bytes_tx += size;
                    f.window_bytes_rx += size;
                }
                if now >= sched.end {
                    // Finished: out of epoll, so that the server closing
                    // later is not taken for a failure.
                    let _ = epoll.delete(&*stream);
                    f.interest = None;
                    return Ok(());
                }
                f.t0 = now;
                progress = m
                    .start(&mut Io::new(stream.as_fd(), &mut *io), bufs)
                    .map_err(|e| flow_failed(f.index, ctx, e))?;
            }
        }
    };
    if f.interest != Some(want) {
        let mut ev = EpollEvent::new(want, slot as u64);
        epoll
            .modify(&*stream, &mut ev)
            .map_err(|e| sys("changing a flow's epoll interest", e))?;
        f.interest = Some(want);
    }
    // Level triggering brings the flow back when it is ready again.
    Ok(())
}

fn connect_ready(
    w: &mut Worker,
    slot: usize,
    sched: Schedule,
    ctx: &Ctx,
    last_error: &mut Option<String>,
) -> Reopen {
    let Worker {
        epoll,
        io,
        bufs,
        flows,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::Connect {
        stream: Some(_),
        connecting,
        ..
    } = f.kind
    else {
        return Reopen::No;
    };
    let now = Instant::now();
    let retry = |now: Instant| {
        if now < sched.end {
            Reopen::Later(now)
        } else {
            Reopen::No
        }
    };
    if connecting && !connection_opened(f, now, ctx, last_error) {
        return retry(now);
    }
    let Kind::Connect {
        stream,
        proof,
        timed,
        m,
        ..
    } = &mut f.kind
    else {
        return Reopen::No;
    };
    let Some(s) = stream.as_ref() else {
        return Reopen::No;
    };
    f.last_progress = now;
    // No request before the far end proved it belongs to the session.
    let result = match proof.as_mut().map(|p| p.pump(&mut &*s)) {
        None => m.pump(&mut Io::new(s.as_fd(), &mut **io), bufs),
        Some(Ok(Progress::Done)) => {
            *proof = None;
            m.begin();
            m.pump(&mut Io::new(s.as_fd(), &mut **io), bufs)
        }
        Some(Ok(waiting)) => Ok(waiting),
        Some(Err(e)) => {
            *stream = None;
            *proof = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(e.to_string());
            return retry(now);
        }
    };
    // While the proof runs, the machine still holds the last connection's
    // end: no reply of this one can have arrived.
    if !*timed && proof.is_none() && m.reply_received() {
        *timed = true;
        f.completed += 1;
        let now = Instant::now();
        if sched.in_window(now) {
            f.hist.record_ns(elapsed_ns(f.t0, now));
            f.round_trips += 1;
            f.window_setup_ns += f.setup_ns;
            let (request_bytes, reply_bytes) = m.sizes_bytes();
            f.window_bytes_tx += request_bytes as u64;
            f.window_bytes_rx += reply_bytes as u64;
        }
    }
    let want = match result {
        Ok(Progress::WantRead) => EpollFlags::EPOLLIN,
        Ok(Progress::WantWrite) => EpollFlags::EPOLLOUT,
        Ok(Progress::Done) => {
            // Closing after the server's end of stream leaves no TIME_WAIT
            // on this side.
            *stream = None;
            f.interest = None;
            let now = Instant::now();
            return if now < sched.end {
                Reopen::Now(now)
            } else {
                Reopen::No
            };
        }
        Err(e) => {
            *stream = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(e.to_string());
            return retry(Instant::now());
        }
    };
    if f.interest != Some(want) {
        let mut ev = EpollEvent::new(want, slot as u64);
        if let Err(e) = epoll.modify(s, &mut ev) {
            *stream = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(format!("changing a connection's epoll interest: {e}"));
            return retry(now);
        }
        f.interest = Some(want);
    }
    Reopen::No
}

/// Finishes a connect-mode flow's non-blocking connect, now writable: its
/// setup time is taken and its session proof (or, without a token, its
/// request) begins. `false` when the connection failed: it is then dropped
/// and counted.
fn connection_opened(
    f: &mut Flow,
    now: Instant,
    ctx: &Ctx,
    last_error: &mut Option<String>,
) -> bool {
    let Kind::Connect {
        stream,
        connecting,
        proof,
        m,
        ..
    } = &mut f.kind
    else {
        return true;
    };
    let Some(s) = stream.as_ref() else {
        return true;
    };
    match s.take_error() {
        Ok(None) => {
            *connecting = false;
            f.setup_ns = elapsed_ns(f.t0, now);
            match &ctx.token {
                Some(token) => match ConnectorHandshake::new(token) {
                    Ok(p) => *proof = Some(Box::new(p)),
                    Err(e) => {
                        *stream = None;
                        f.interest = None;
                        f.errors += 1;
                        *last_error = Some(format!("no random bytes for a nonce: {e}"));
                        return false;
                    }
                },
                None => m.begin(),
            }
            true
        }
        Ok(Some(e)) | Err(e) => {
            *stream = None;
            f.interest = None;
            f.errors += 1;
            *last_error = Some(e.to_string());
            false
        }
    }
}
