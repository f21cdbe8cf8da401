//! The datagram flows of a worker: each request is issued with a re-send
//! deadline in the worker's retry queue, and sent again when it passes.

use super::worker::{elapsed_ns, flow_failed};
use super::{Ctx, Kind, Schedule, Worker};
use crate::flows::io::Io;
use crate::flows::machine::Progress;
use crate::flows::EngineError;
use crate::rto;
use std::os::fd::AsFd;
use std::time::Instant;

/// Issues the next request of the datagram flow in `slot` and sets its
/// re-send deadline one retry timeout away.
pub(super) fn datagram_start(
    w: &mut Worker,
    slot: usize,
    now: Instant,
    ctx: &Ctx,
) -> Result<(), EngineError> {
    let Worker {
        io,
        bufs,
        flows,
        retries,
        rto,
        ..
    } = w;
    let f = &mut flows[slot];
    f.t0 = now;
    f.last_progress = now;
    let Kind::Datagram {
        socket,
        m,
        retry_at,
        backoff,
        queued,
    } = &mut f.kind
    else {
        return Ok(());
    };
    m.start(&mut Io::new(socket.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    *backoff = rto.get();
    let at = now + *backoff;
    *retry_at = Some(at);
    if !*queued {
        retries.push(at, slot);
        *queued = true;
    }
    Ok(())
}

/// Reads the replies of the datagram flow in `slot`: a finished round trip
/// is recorded (and teaches the retry timeout, if it needed no re-send) and
/// the next request issued, until the window is over.
pub(super) fn datagram_ready(
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
        rto,
        ..
    } = w;
    let f = &mut flows[slot];
    let Kind::Datagram {
        socket,
        m,
        retry_at,
        backoff,
        ..
    } = &mut f.kind
    else {
        return Ok(());
    };
    let progress = m
        .pump(&mut Io::new(socket.as_fd(), &mut **io), bufs)
        .map_err(|e| flow_failed(f.index, ctx, e))?;
    if progress != Progress::Done {
        return Ok(());
    }
    let now = Instant::now();
    *retry_at = None;
    f.last_progress = now;
    if m.retried() {
        rto.back_off(*backoff);
    } else {
        rto.observe(now.duration_since(f.t0));
    }
    if sched.in_window(now) {
        let size = m.size_bytes() as u64;
        f.hist.record_ns(elapsed_ns(f.t0, now));
        f.round_trips += 1;
        f.window_bytes_tx += size;
        f.window_bytes_rx += size;
    }
    if now >= sched.end {
        // Finished: replies to earlier re-sends may still come, and are
        // nobody's business now.
        let _ = epoll.delete(&*socket);
        f.interest = None;
        return Ok(());
    }
    datagram_start(w, slot, now, ctx)
}

/// Sends again the requests whose retry deadline has passed, backing off
/// each (doubling up to the longest retry timeout), and re-queues flows
/// whose deadline moved on since their queue entry was made.
pub(super) fn resend_due(w: &mut Worker, now: Instant, ctx: &Ctx) -> Result<(), EngineError> {
    while let Some(slot) = w.retries.pop_due(now) {
        let Some(f) = w.flows.get_mut(slot) else {
            continue;
        };
        let Kind::Datagram {
            socket,
            m,
            retry_at,
            backoff,
            queued,
        } = &mut f.kind
        else {
            continue;
        };
        *queued = false;
        let Some(at) = *retry_at else {
            continue;
        };
        let at = if at <= now {
            m.resend(&mut Io::new(socket.as_fd(), &mut *w.io), &mut w.bufs)
                .map_err(|e| flow_failed(f.index, ctx, e))?;
            *backoff = rto::backed_off(*backoff);
            let next = now + *backoff;
            *retry_at = Some(next);
            next
        } else {
            at
        };
        w.retries.push(at, slot);
        *queued = true;
    }
    Ok(())
}
