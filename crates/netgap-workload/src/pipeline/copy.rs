//! One copy of a pipeline stage at work: the producer cutting the query
//! into UOWs, a filter passing each on transformed, the consumer checking
//! each; the credits of demand-driven flow control and the readers of a
//! copy's inbound streams.

use super::role::{CopyDone, CopyEnds, Env};
use super::work::Frame;
use super::{flow_err, work, PipeError};
use crate::staged::recv_patient;
use netgap_core::stats::LatencyHistogram;
use netgap_transport::buffer::AlignedBuffer;
use netgap_transport::{self as transport, FlowError};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Credits of a copy's outbound streams: how many more UOWs each may
/// carry now.
struct Credits {
    state: Mutex<CreditState>,
    cv: Condvar,
    max: u32,
}

struct CreditState {
    free: Vec<u32>,
    failed: Option<String>,
}

impl Credits {
    fn new(streams: usize, max: u32) -> Credits {
        Credits {
            state: Mutex::new(CreditState {
                free: vec![max; streams],
                failed: None,
            }),
            cv: Condvar::new(),
            max,
        }
    }

    /// Takes a credit of the first stream from `from` on that has one,
    /// waiting for one.
    fn take(&self, from: usize, env: &Env) -> Result<usize, PipeError> {
        let poisoned = || PipeError("a copy's credits were poisoned".into());
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(why) = &s.failed {
                return Err(PipeError(why.clone()));
            }
            let n = s.free.len();
            if let Some(i) = (0..n).map(|k| (from + k) % n).find(|&i| s.free[i] > 0) {
                s.free[i] -= 1;
                return Ok(i);
            }
            if env.stop.is_set() {
                return Err(PipeError("stopped".into()));
            }
            if Instant::now() >= env.deadline {
                return Err(PipeError(
                    "the query did not finish within the window; lengthen --duration".into(),
                ));
            }
            s = self
                .cv
                .wait_timeout(s, crate::role::STOP_TICK)
                .map_err(|_| poisoned())?
                .0;
        }
    }

    fn give(&self, i: usize, n: u32) -> Result<(), PipeError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| PipeError("a copy's credits were poisoned".into()))?;
        let free = s
            .free
            .get_mut(i)
            .ok_or_else(|| PipeError("no such stream".into()))?;
        *free = free.saturating_add(n);
        if *free > self.max {
            return Err(PipeError(
                "a downstream copy returned more credits than it was sent UOWs".into(),
            ));
        }
        self.cv.notify_all();
        Ok(())
    }

    fn fail(&self, why: String) {
        if let Ok(mut s) = self.state.lock() {
            s.failed.get_or_insert(why);
        }
        self.cv.notify_all();
    }
}

/// Reads the credits a downstream copy returns on stream `i` until it
/// closes the stream.
fn read_credits(
    mut rx: Box<dyn transport::Receiver>,
    credits: &Credits,
    i: usize,
    env: &Env,
) -> Result<(), PipeError> {
    let mut buf = [0u8; 64];
    loop {
        match rx.recv_some(&mut buf) {
            Ok(n) => credits.give(i, n as u32)?,
            Err(FlowError::Closed) => return Ok(()),
            Err(FlowError::TimedOut { .. })
                if Instant::now() < env.deadline && !env.stop.is_set() => {}
            Err(e) => {
                return Err(flow_err(format_args!(
                    "reading credits on outbound stream {i}"
                ))(e))
            }
        }
    }
}

/// What an inbound stream hands its copy.
enum Inbox {
    Uow {
        from: usize,
        frame: Frame,
        data: AlignedBuffer,
    },
    Eow,
    Failed(String),
}

/// Reads UOWs from inbound stream `from` until its end-of-work marker.
fn read_uows(
    mut rx: Box<dyn transport::Receiver>,
    from: usize,
    tx: &mpsc::SyncSender<Inbox>,
    env: &Env,
) {
    let r = (|| -> Result<(), PipeError> {
        loop {
            let mut hb = [0u8; work::HEADER_BYTES];
            recv_patient(rx.as_mut(), &mut hb, env.deadline, &env.stop).map_err(flow_err(
                format_args!("reading a UOW's header on inbound stream {from}"),
            ))?;
            let frame = Frame::decode(&hb);
            match frame.kind {
                work::KIND_EOW => {
                    let _ = tx.send(Inbox::Eow);
                    return Ok(());
                }
                work::KIND_UOW => {
                    let want = work::uow_len(frame.seq, env.query_bytes, env.uow_bytes);
                    if frame.seq >= env.uows() || u64::from(frame.len) != want {
                        return Err(PipeError(format!(
                            "a UOW numbered {} of {} bytes is not in the query",
                            frame.seq, frame.len
                        )));
                    }
                    let mut data = AlignedBuffer::zeroed(frame.len as usize, env.layout);
                    rx.recv_exact(&mut data).map_err(flow_err(format_args!(
                        "reading UOW {} on inbound stream {from}",
                        frame.seq
                    )))?;
                    if tx.send(Inbox::Uow { from, frame, data }).is_err() {
                        return Ok(());
                    }
                }
                k => return Err(PipeError(format!("a frame of unknown kind {k}"))),
            }
        }
    })();
    if let Err(e) = r {
        let _ = tx.send(Inbox::Failed(e.0));
    }
}

/// Spins for `d`: a filter's fixed compute time, as real CPU work.
fn compute_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs one copy: the producer sends the query, a filter passes every UOW
/// on transformed, the consumer checks every UOW.
pub(super) fn run_copy(ends: CopyEnds, env: &Env) -> Result<CopyDone, PipeError> {
    let stage = env.graph.stage_of(ends.copy);
    let last = env.graph.stages() - 1;
    // Outbound: send halves here, credit readers on threads of their own.
    let credits = Arc::new(Credits::new(ends.outbound.len(), env.credits));
    let mut out_tx = Vec::with_capacity(ends.outbound.len());
    let mut credit_readers = Vec::with_capacity(ends.outbound.len());
    for (i, f) in ends.outbound.into_iter().enumerate() {
        let (tx, rx) = f.into_halves();
        out_tx.push(tx);
        let credits = Arc::clone(&credits);
        let env = env.clone();
        let h = std::thread::Builder::new()
            .name(format!("credits {}:{i}", ends.copy))
            .spawn(move || {
                let r = read_credits(rx, &credits, i, &env);
                if let Err(e) = &r {
                    credits.fail(e.0.clone());
                }
                r
            })
            .map_err(|e| PipeError(format!("cannot start a credit reader: {e}")))?;
        credit_readers.push(h);
    }
    // Inbound: readers on threads of their own, send halves here for
    // credits. At most `credits` UOWs wait per stream.
    let inbound = ends.inbound.len();
    let (itx, irx) = mpsc::sync_channel(inbound * (env.credits as usize + 1));
    let mut in_tx = Vec::with_capacity(inbound);
    let mut readers = Vec::with_capacity(inbound);
    for (i, f) in ends.inbound.into_iter().enumerate() {
        let (tx, rx) = f.into_halves();
        in_tx.push(tx);
        let itx = itx.clone();
        let env = env.clone();
        let h = std::thread::Builder::new()
            .name(format!("uows {}:{i}", ends.copy))
            .spawn(move || read_uows(rx, i, &itx, &env))
            .map_err(|e| PipeError(format!("cannot start a UOW reader: {e}")))?;
        readers.push(h);
    }
    drop(itx);
    let r = if stage == 0 {
        produce(&mut out_tx, &credits, env)
    } else {
        pass_on(
            stage,
            stage == last,
            &irx,
            &mut in_tx,
            &mut out_tx,
            &credits,
            env,
        )
    };
    if r.is_err() {
        credits.fail("the copy failed".into());
    }
    // Closing our ends lets the neighbours' readers finish.
    drop(in_tx);
    drop(irx);
    for h in readers {
        let _ = h.join();
    }
    let mut reader_err = None;
    drop(out_tx);
    for h in credit_readers {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                reader_err.get_or_insert(e);
            }
            Err(_) => {
                reader_err.get_or_insert(PipeError("a credit reader panicked".into()));
            }
        }
    }
    let done = r?;
    match reader_err {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

/// Sends `frame` and its `data` on outbound stream `i`.
fn send_frame(
    tx: &mut dyn transport::Sender,
    i: usize,
    frame: Frame,
    data: &[u8],
) -> Result<(), PipeError> {
    // What the copy was doing, made only on a failure: every frame of the
    // query comes through here.
    let failed = |e| {
        flow_err(match frame.kind {
            work::KIND_UOW => format!("sending UOW {} on outbound stream {i}", frame.seq),
            _ => format!("sending the end-of-work marker on outbound stream {i}"),
        })(e)
    };
    tx.send_all(&frame.encode()).map_err(failed)?;
    if !data.is_empty() {
        tx.send_all(data).map_err(failed)?;
    }
    Ok(())
}

fn end_of_work(out_tx: &mut [Box<dyn transport::Sender>]) -> Result<(), PipeError> {
    let eow = Frame {
        kind: work::KIND_EOW,
        len: 0,
        seq: 0,
        sent_ns: 0,
        sum: 0,
    };
    for (i, tx) in out_tx.iter_mut().enumerate() {
        send_frame(tx.as_mut(), i, eow, &[])?;
    }
    Ok(())
}

/// The producer: every UOW of the query to whichever downstream copy has
/// credit, then an end-of-work marker to each.
fn produce(
    out_tx: &mut [Box<dyn transport::Sender>],
    credits: &Credits,
    env: &Env,
) -> Result<CopyDone, PipeError> {
    let mut done = CopyDone::default();
    let mut buf = AlignedBuffer::zeroed(
        usize::try_from(env.uow_bytes).unwrap_or(usize::MAX),
        env.layout,
    );
    let mut next = 0;
    for seq in 0..env.uows() {
        let n = work::uow_len(seq, env.query_bytes, env.uow_bytes) as usize;
        let data = &mut buf[..n];
        work::produce(seq, env.uow_bytes, data);
        let i = credits.take(next, env)?;
        next = i + 1;
        let frame = Frame {
            kind: work::KIND_UOW,
            len: n as u32,
            seq,
            sent_ns: netgap_core::units::ns_since(env.t0),
            sum: work::checksum(data),
        };
        send_frame(out_tx[i].as_mut(), i, frame, data)?;
        done.uows += 1;
        done.bytes_tx += n as u64;
    }
    end_of_work(out_tx)?;
    done.done_ns = netgap_core::units::ns_since(env.t0);
    Ok(done)
}

/// A filter or the consumer: takes UOWs as they come from any upstream
/// copy, checks each, transforms it (a filter) or checks it against what
/// it must be (the consumer), passes it on to a downstream copy with
/// credit, and returns the upstream stream's credit.
#[allow(clippy::too_many_arguments, reason = "one copy's whole state")]
fn pass_on(
    stage: u32,
    consumer: bool,
    irx: &mpsc::Receiver<Inbox>,
    in_tx: &mut [Box<dyn transport::Sender>],
    out_tx: &mut [Box<dyn transport::Sender>],
    credits: &Credits,
    env: &Env,
) -> Result<CopyDone, PipeError> {
    let mut done = CopyDone::default();
    let uows = env.uows();
    let mut seen = if consumer {
        vec![false; usize::try_from(uows).unwrap_or(0)]
    } else {
        Vec::new()
    };
    let mut hist = LatencyHistogram::new();
    let mut expect = AlignedBuffer::zeroed(
        usize::try_from(env.uow_bytes).unwrap_or(usize::MAX),
        env.layout,
    );
    let mut open = in_tx.len();
    let mut next = 0;
    while open > 0 {
        let msg = loop {
            match irx.recv_timeout(crate::role::STOP_TICK) {
                Ok(m) => break m,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if env.stop.is_set() {
                        return Err(PipeError("stopped".into()));
                    }
                    if Instant::now() >= env.deadline {
                        return Err(PipeError(
                            "the query did not finish within the window; lengthen --duration"
                                .into(),
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(PipeError("an upstream stream ended early".into()))
                }
            }
        };
        let (from, frame, mut data) = match msg {
            Inbox::Eow => {
                open -= 1;
                continue;
            }
            Inbox::Failed(why) => return Err(PipeError(why)),
            Inbox::Uow { from, frame, data } => (from, frame, data),
        };
        done.bytes_rx += data.len() as u64;
        if work::checksum(&data) != frame.sum {
            return Err(PipeError(format!(
                "UOW {} arrived with a bad checksum",
                frame.seq
            )));
        }
        if consumer {
            let n = data.len();
            work::expected(
                frame.seq,
                env.uow_bytes,
                env.graph.filters,
                &mut expect[..n],
            );
            if data[..] != expect[..n] {
                return Err(PipeError(format!(
                    "UOW {} differs from the producer's data through every filter",
                    frame.seq
                )));
            }
            let slot = seen
                .get_mut(frame.seq as usize)
                .ok_or_else(|| PipeError("a UOW past the query".into()))?;
            if *slot {
                return Err(PipeError(format!("UOW {} arrived twice", frame.seq)));
            }
            *slot = true;
            hist.record_ns(netgap_core::units::ns_since(env.t0).saturating_sub(frame.sent_ns));
        } else {
            work::transform(stage, &mut data);
            compute_for(env.compute);
            let i = credits.take(next, env)?;
            next = i + 1;
            let out = Frame {
                sum: work::checksum(&data),
                ..frame
            };
            send_frame(out_tx[i].as_mut(), i, out, &data)?;
            done.bytes_tx += data.len() as u64;
        }
        done.uows += 1;
        in_tx
            .get_mut(from)
            .ok_or_else(|| PipeError("no such stream".into()))?
            .send_all(&[1])
            .map_err(flow_err(format_args!(
                "returning a credit on inbound stream {from}"
            )))?;
    }
    if consumer {
        let got = seen.iter().filter(|s| **s).count() as u64;
        if got != uows {
            return Err(PipeError(format!(
                "the query ended with {got} of {uows} UOWs"
            )));
        }
        done.hist = Some(hist);
    } else {
        end_of_work(out_tx)?;
    }
    done.done_ns = netgap_core::units::ns_since(env.t0);
    Ok(done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::pipeline::graph::Graph;
    use crate::role::Stop;
    use netgap_transport::buffer::BufferLayout;

    fn env() -> Env {
        Env {
            graph: Graph {
                filters: 1,
                copies: 1,
            },
            uow_bytes: 1024,
            query_bytes: 4096,
            credits: 2,
            compute: Duration::ZERO,
            t0: Instant::now(),
            deadline: Instant::now() + Duration::from_secs(2),
            stop: Stop::new(),
            layout: BufferLayout::default(),
        }
    }

    /// What a UOW reader hands its copy for `bytes` from upstream.
    fn read(bytes: &[u8]) -> Vec<Inbox> {
        let (down, mut up) = crate::staged::flow_pair();
        up.send_all(bytes).unwrap();
        drop(up);
        let (tx, rx) = mpsc::sync_channel(8);
        let (_, r) = down.into_halves();
        read_uows(r, 0, &tx, &env());
        drop(tx);
        rx.iter().collect()
    }

    fn frame(kind: u8, len: u32, seq: u64) -> Vec<u8> {
        Frame {
            kind,
            len,
            seq,
            sent_ns: 0,
            sum: 0,
        }
        .encode()
        .to_vec()
    }

    #[test]
    fn frames_outside_the_query_end_the_stream_with_one_line() {
        let failed = |v: Vec<Inbox>| match v.last() {
            Some(Inbox::Failed(why)) => why.clone(),
            _ => panic!("not failed"),
        };
        // A UOW numbered past the query (4 UOWs of 1 KiB).
        assert!(failed(read(&frame(work::KIND_UOW, 1024, 4))).contains("not in the query"));
        // A UOW of a length that is not its own.
        assert!(failed(read(&frame(work::KIND_UOW, 1 << 30, 0))).contains("not in the query"));
        assert!(failed(read(&frame(7, 0, 0))).contains("unknown kind 7"));
        // A closed stream before the end-of-work marker.
        assert!(!failed(read(&[])).is_empty());
        // A UOW and the marker are handed on.
        let mut ok = frame(work::KIND_UOW, 1024, 3);
        ok.extend(vec![0u8; 1024]);
        ok.extend(frame(work::KIND_EOW, 0, 0));
        let got = read(&ok);
        assert!(matches!(got[0], Inbox::Uow { ref frame, .. } if frame.seq == 3));
        assert!(matches!(got[1], Inbox::Eow));
    }
}
