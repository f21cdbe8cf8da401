//! A `pio` client: one thread per server flow, each moving the client's
//! pieces that live on its server, a bounded number of requests in flight.
//! The client's threads meet at a gate of their own after each server
//! barrier and at the end of each phase, so the client's time of a phase
//! runs from all its servers' barrier to its last server's answer; the
//! thread that opens the gate reads the phase's edge there
//! ([`WindowEdge`]: the clock, the host's counters and the agent's CPU
//! time), so the client's CPU of a phase is read at the same instants as
//! its time.

use super::layout::{self, Piece};
use super::wire::{self, Header};
use super::{Phase, PioError};
use crate::role::{Stop, WindowEdge};
use crate::staged::recv_patient;
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::{self as transport, FlowError};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Requests a client keeps in flight on each server flow.
pub(crate) const IN_FLIGHT: usize = 8;

/// Where a client's threads wait for each other.
pub(crate) struct Gate {
    threads: usize,
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    arrived: usize,
    generation: u64,
    released: WindowEdge,
    failed: bool,
}

impl Gate {
    /// A gate for `threads` threads.
    pub(crate) fn new(threads: usize) -> Gate {
        Gate {
            threads,
            state: Mutex::new(GateState {
                arrived: 0,
                generation: 0,
                released: WindowEdge::now(),
                failed: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Lets every waiting thread go for good: a sibling failed.
    pub(crate) fn fail(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.failed = true;
        }
        self.cv.notify_all();
    }

    /// Waits until every thread has arrived; returns the edge the last
    /// one read as it opened the gate.
    pub(crate) fn wait(&self, deadline: Instant, stop: &Stop) -> Result<WindowEdge, PioError> {
        let poisoned = || PioError("a client's gate was poisoned".into());
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        s.arrived += 1;
        if s.arrived == self.threads {
            s.arrived = 0;
            s.generation += 1;
            s.released = WindowEdge::now();
            self.cv.notify_all();
            return Ok(s.released);
        }
        let generation = s.generation;
        while s.generation == generation {
            if s.failed || stop.is_set() {
                return Err(PioError("another flow of this client failed".into()));
            }
            if Instant::now() >= deadline {
                return Err(PioError(
                    "the client's flows did not finish within the window; lengthen --duration"
                        .into(),
                ));
            }
            s = self
                .cv
                .wait_timeout(s, crate::role::STOP_TICK)
                .map_err(|_| poisoned())?
                .0;
        }
        Ok(s.released)
    }
}

/// What one server flow of a client did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moved {
    /// Bytes written.
    pub written: u64,
    /// Bytes read back and checked.
    pub read: u64,
    /// Requests made.
    pub requests: u64,
    /// The client's write phase, from the gate after the servers' first
    /// barrier to the gate after the last sync (the same on every flow of
    /// a client).
    pub write: Phase,
    /// The client's read phase, from the gate after the servers' second
    /// barrier to the gate after the last read.
    pub read_phase: Phase,
}

fn flow_err(e: FlowError) -> PioError {
    PioError(e.to_string())
}

fn status(
    rx: &mut dyn transport::Receiver,
    deadline: Instant,
    stop: &Stop,
    what: &str,
) -> Result<(), PioError> {
    let mut b = [0u8; 1];
    recv_patient(rx, &mut b, deadline, stop).map_err(flow_err)?;
    if b[0] != wire::STATUS_OK {
        return Err(PioError(format!(
            "the server failed a {what}; see its error"
        )));
    }
    Ok(())
}

fn send(tx: &mut dyn transport::Sender, h: Header) -> Result<(), PioError> {
    tx.send_all(&h.encode()).map_err(flow_err)
}

/// The job of one flow: the pieces of this client on this server.
pub(crate) struct Job<'a> {
    /// The flow to the server.
    pub flow: &'a mut dyn transport::Flow,
    /// This client's pieces on that server, in order.
    pub pieces: &'a [Piece],
    /// The client's gate.
    pub gate: &'a Gate,
    /// The contents this client writes.
    pub contents: &'a layout::Contents,
    /// Largest piece, bytes.
    pub stripe_bytes: usize,
    /// Where the flow's buffers' data starts (`--align`, `--offset`).
    pub buffer: BufferLayout,
    /// When the repetition's window ends.
    pub deadline: Instant,
    /// The session's end.
    pub stop: &'a Stop,
}

/// Runs a flow's job: barrier, writes, sync, barrier, reads checked
/// against what was written, done. On failure the client's gate is failed
/// so its other flows stop waiting.
pub(crate) fn run(job: Job<'_>) -> Result<Moved, PioError> {
    let gate = job.gate;
    let r = run_inner(job);
    if r.is_err() {
        gate.fail();
    }
    r
}

fn run_inner(job: Job<'_>) -> Result<Moved, PioError> {
    let Job {
        flow,
        pieces,
        gate,
        contents,
        stripe_bytes,
        buffer,
        deadline,
        stop,
    } = job;
    let (tx, rx) = flow.split();
    let (mut written, mut read, mut requests) = (0u64, 0u64, 0u64);
    let mut buf = AlignedBuffer::zeroed(stripe_bytes, buffer);
    let mut scratch = AlignedBuffer::zeroed(stripe_bytes, buffer);
    let barrier = |tx: &mut dyn transport::Sender,
                   rx: &mut dyn transport::Receiver,
                   n: u64|
     -> Result<(), PioError> {
        send(
            tx,
            Header {
                op: wire::OP_BARRIER,
                len: 0,
                offset: n,
            },
        )?;
        status(rx, deadline, stop, "barrier")
    };
    let len_of = |p: &Piece| {
        usize::try_from(p.len)
            .unwrap_or(usize::MAX)
            .min(stripe_bytes)
    };

    // Write phase.
    barrier(tx, rx, 0)?;
    let t0 = gate.wait(deadline, stop)?;
    let mut acked = 0;
    for (i, p) in pieces.iter().enumerate() {
        if i - acked >= IN_FLIGHT {
            status(rx, deadline, stop, "write")?;
            acked += 1;
        }
        let n = len_of(p);
        contents.piece(p.logical_offset, &mut buf[..n]);
        send(
            tx,
            Header {
                op: wire::OP_WRITE,
                len: n as u32,
                offset: p.local_offset,
            },
        )?;
        tx.send_all(&buf[..n]).map_err(flow_err)?;
        written += n as u64;
        requests += 1;
    }
    while acked < pieces.len() {
        status(rx, deadline, stop, "write")?;
        acked += 1;
    }
    send(
        tx,
        Header {
            op: wire::OP_SYNC,
            len: 0,
            offset: 0,
        },
    )?;
    status(rx, deadline, stop, "sync")?;
    let t1 = gate.wait(deadline, stop)?;

    // Read phase, every byte checked.
    barrier(tx, rx, 1)?;
    let t2 = gate.wait(deadline, stop)?;
    let mut asked = 0;
    for (k, p) in pieces.iter().enumerate() {
        while asked < pieces.len() && asked < k + IN_FLIGHT {
            let q = &pieces[asked];
            send(
                tx,
                Header {
                    op: wire::OP_READ,
                    len: len_of(q) as u32,
                    offset: q.local_offset,
                },
            )?;
            asked += 1;
        }
        let n = len_of(p);
        recv_patient(rx, &mut buf[..n], deadline, stop).map_err(flow_err)?;
        if let Some(at) = contents.first_mismatch(&buf[..n], p.logical_offset, &mut scratch) {
            return Err(PioError(format!(
                "read back differs from what was written at logical offset {at}"
            )));
        }
        read += n as u64;
        requests += 1;
    }
    let t3 = gate.wait(deadline, stop)?;
    send(
        tx,
        Header {
            op: wire::OP_DONE,
            len: 0,
            offset: 0,
        },
    )?;
    Ok(Moved {
        written,
        read,
        requests,
        write: (t0, t1),
        read_phase: (t2, t3),
    })
}
