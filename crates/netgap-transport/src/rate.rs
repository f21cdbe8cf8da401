//! A data-rate budget shared by every flow of an agent (`netgap serve
//! --max-rate`), and a [`Flow`] that spends it.
//!
//! The budget is a virtual clock (GCRA, the token bucket's other form):
//! one atomic holds the time by which every byte charged so far is due at
//! the rate. A flow moves bytes, then charges them; a charge that puts the
//! clock more than [`BURST`] ahead of real time says how long the flow
//! must wait before it moves more. Over any stretch of time the flows
//! sharing a budget move at most the rate times (the stretch plus
//! [`BURST`]), plus what one call moved before it was charged. A charge is
//! a clock read and one compare-and-swap, and each half of a flow charges
//! in grants (100 µs at the rate, at most 64 KiB) that it then spends
//! without touching the budget, so a flow of small messages pays for the
//! budget once per grant, not once per call: it costs nothing measurable
//! when the rate is far above what the path does, and it always bounds.
//!
//! A [`PacedFlow`] waits in slices of at most [`WAIT_SLICE`], failing
//! once its flow is aborted (or the work it serves stopped), and moves at most [`PacedFlow::chunk`]
//! bytes per call on a byte stream, so one call's debt stays small: a
//! paced flow neither stalls past its peer's inactivity timeout nor
//! ignores the abort that ends a run.

use crate::{Abort, AbortHandle, Flow, FlowError, FlowMonitor, Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far ahead of real time the flows may be before they wait: the
/// budget's burst, as time at the rate.
pub const BURST: Duration = Duration::from_millis(5);
/// The longest single sleep of a waiting flow; it checks its abort flag
/// between sleeps.
pub const WAIT_SLICE: Duration = Duration::from_millis(10);
/// How much time at the rate one call of a byte-stream flow may move:
/// its debt, and so its wait, is at most about this.
const CHUNK_TIME: Duration = Duration::from_millis(5);
/// The smallest chunk, bytes, whatever the rate: a call moves at least
/// this much.
const MIN_CHUNK_BYTES: usize = 4096;

/// The highest data rate of everything that charges it.
#[derive(Debug)]
pub struct RateBudget {
    epoch: Instant,
    /// Cost of a byte at the rate, picoseconds.
    ps_per_byte: u64,
    rate_gbps: f64,
    /// When every byte charged so far is due, ns since `epoch`.
    due_ns: AtomicU64,
}

impl RateBudget {
    /// A budget of `rate_gbps` (10^9 bit/s, payload), positive and finite
    /// (the agent's limits are validated before).
    pub fn new(rate_gbps: f64) -> RateBudget {
        // 8 bits per byte at rate_gbps bits per ns: 8000 / rate ps a byte.
        let ps = (8000.0 / rate_gbps).ceil();
        let ps_per_byte = if ps.is_finite() && ps >= 1.0 {
            ps.min(u64::MAX as f64) as u64
        } else {
            1
        };
        RateBudget {
            epoch: Instant::now(),
            ps_per_byte,
            rate_gbps,
            due_ns: AtomicU64::new(0),
        }
    }

    /// The rate, Gbit/s.
    pub fn rate_gbps(&self) -> f64 {
        self.rate_gbps
    }

    /// Bytes moved in `t` at the rate.
    pub fn bytes_in(&self, t: Duration) -> u64 {
        let ps = t.as_nanos().saturating_mul(1000);
        u64::try_from(ps / u128::from(self.ps_per_byte)).unwrap_or(u64::MAX)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Charges `bytes` just moved; how long to wait before moving more
    /// (zero while within the rate and its burst).
    pub fn charge(&self, bytes: u64) -> Duration {
        if bytes == 0 {
            return self.ahead();
        }
        let cost_ns = bytes.saturating_mul(self.ps_per_byte).div_ceil(1000);
        let now = self.now_ns();
        let mut due = 0;
        // The closure always returns Some, so the update cannot fail.
        let _ = self
            .due_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                // Idle time earns no credit past the burst.
                due = d.max(now).saturating_add(cost_ns);
                Some(due)
            });
        wait_for(due, now)
    }

    /// How long to wait before moving anything, without charging.
    pub fn ahead(&self) -> Duration {
        wait_for(self.due_ns.load(Ordering::Acquire), self.now_ns())
    }
}

/// The wait until `due_ns` is within the burst of `now_ns`.
fn wait_for(due_ns: u64, now_ns: u64) -> Duration {
    let burst_ns = u64::try_from(BURST.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(due_ns.saturating_sub(now_ns.saturating_add(burst_ns)))
}

/// A flow's abort flag, raised with the flow's own abort.
#[derive(Default)]
struct Aborted(AtomicBool);

/// Ends the inner flow and raises the flag a waiting [`PacedFlow`] checks.
struct PacedAbort {
    inner: Option<AbortHandle>,
    flag: Arc<Aborted>,
}

impl Abort for PacedAbort {
    fn abort(&self) {
        self.flag.0.store(true, Ordering::Relaxed);
        if let Some(h) = &self.inner {
            h.abort();
        }
    }
}

/// The pacing both halves of a [`PacedFlow`] share.
#[derive(Clone)]
struct Pace {
    budget: Arc<RateBudget>,
    aborted: Arc<Aborted>,
    /// Most bytes one call moves; `usize::MAX` for a flow with message
    /// boundaries, whose messages go whole.
    chunk: usize,
    /// A signal that the work the flow serves is over (a role's stop).
    stop: Option<Arc<AtomicBool>>,
    /// Bytes this half has already charged to the budget and not yet
    /// moved: a half takes its budget in grants of [`Pace::grant_bytes`],
    /// so a flow of small messages reads the clock and touches the shared
    /// atomic once per grant, not once per call.
    credit_bytes: u64,
}

/// The most one half charges ahead of what it moves, bytes.
const MAX_GRANT_BYTES: u64 = 64 * 1024;
/// The most one half charges ahead of what it moves, as time at the rate.
const GRANT_TIME: Duration = Duration::from_micros(100);

impl Pace {
    /// How much a half charges at once when its credit runs out: 100 µs at
    /// the rate, at most 64 KiB, so the credit all halves hold stays far
    /// below the budget's burst.
    fn grant_bytes(&self) -> u64 {
        self.budget.bytes_in(GRANT_TIME).min(MAX_GRANT_BYTES)
    }

    /// Charges `bytes` and waits out what the budget asks, in slices; a
    /// flow aborted or stopped meanwhile fails at once instead.
    fn spend(&mut self, bytes: u64) -> Result<(), FlowError> {
        if bytes <= self.credit_bytes {
            self.credit_bytes -= bytes;
            return Ok(());
        }
        let take = (bytes - self.credit_bytes).max(self.grant_bytes());
        self.credit_bytes = self.credit_bytes + take - bytes;
        let mut wait = self.budget.charge(take);
        while !wait.is_zero() {
            let stopped = self
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed));
            if stopped || self.aborted.0.load(Ordering::Relaxed) {
                return Err(crate::aborted());
            }
            std::thread::sleep(wait.min(WAIT_SLICE));
            wait = self.budget.ahead();
        }
        Ok(())
    }
}

/// A flow whose every byte sent or received is charged to a
/// [`RateBudget`] shared with other flows.
pub struct PacedFlow {
    tx: PacedSender,
    rx: PacedReceiver,
    abort: Option<AbortHandle>,
    monitor: Option<Arc<dyn FlowMonitor>>,
    /// The paced flow's own [`Flow::reliable`].
    reliable: bool,
    path_choices: Vec<String>,
}

impl PacedFlow {
    /// `flow`, paced by `budget`. A flow with `message_boundaries` sends
    /// and receives each message whole (its messages are small: one
    /// datagram); a byte stream moves at most [`PacedFlow::chunk`] bytes
    /// per call.
    pub fn new(flow: Box<dyn Flow>, budget: Arc<RateBudget>, message_boundaries: bool) -> Self {
        let aborted = Arc::new(Aborted::default());
        let abort = Some(AbortHandle::new(Arc::new(PacedAbort {
            inner: flow.abort_handle(),
            flag: Arc::clone(&aborted),
        })));
        let monitor = flow.monitor();
        let reliable = flow.reliable();
        let path_choices = flow.path_choices();
        let chunk = if message_boundaries {
            usize::MAX
        } else {
            PacedFlow::chunk(&budget)
        };
        let pace = Pace {
            budget,
            aborted,
            chunk,
            stop: None,
            credit_bytes: 0,
        };
        let (tx, rx) = flow.into_halves();
        PacedFlow {
            tx: PacedSender {
                inner: tx,
                pace: pace.clone(),
            },
            rx: PacedReceiver { inner: rx, pace },
            abort,
            monitor,
            reliable,
            path_choices,
        }
    }

    /// Ends any wait for the budget, failing the call, once `stop` is
    /// set: the work the flow serves is over.
    pub fn stopped_by(mut self, stop: Arc<AtomicBool>) -> PacedFlow {
        self.tx.pace.stop = Some(Arc::clone(&stop));
        self.rx.pace.stop = Some(stop);
        self
    }

    /// Most bytes one call of a paced byte stream moves: what the rate
    /// moves in a few milliseconds, at least 4 KiB.
    pub fn chunk(budget: &RateBudget) -> usize {
        usize::try_from(budget.bytes_in(CHUNK_TIME))
            .unwrap_or(usize::MAX)
            .max(MIN_CHUNK_BYTES)
    }
}

/// The sending half of a [`PacedFlow`].
struct PacedSender {
    inner: Box<dyn Sender>,
    pace: Pace,
}

impl Sender for PacedSender {
    fn send_some(&mut self, buf: &[u8]) -> Result<usize, FlowError> {
        let len = buf.len().min(self.pace.chunk);
        let n = self.inner.send_some(&buf[..len])?;
        self.pace.spend(n as u64)?;
        Ok(n)
    }

    fn send_all(&mut self, buf: &[u8]) -> Result<(), FlowError> {
        // The inner flow's own whole-buffer send (zero-copy, a ring's
        // batch), a chunk at a time.
        for part in buf.chunks(self.pace.chunk.max(1)) {
            self.inner.send_all(part)?;
            self.pace.spend(part.len() as u64)?;
        }
        Ok(())
    }

    fn end_burst(&mut self) -> Result<(), FlowError> {
        self.inner.end_burst()
    }
}

/// The receiving half of a [`PacedFlow`].
struct PacedReceiver {
    inner: Box<dyn Receiver>,
    pace: Pace,
}

impl Receiver for PacedReceiver {
    fn recv_some(&mut self, buf: &mut [u8]) -> Result<usize, FlowError> {
        let len = buf.len().min(self.pace.chunk);
        let n = self.inner.recv_some(&mut buf[..len])?;
        self.pace.spend(n as u64)?;
        Ok(n)
    }

    fn recv_exact(&mut self, buf: &mut [u8]) -> Result<(), FlowError> {
        for part in buf.chunks_mut(self.pace.chunk.max(1)) {
            self.inner.recv_exact(part)?;
            self.pace.spend(part.len() as u64)?;
        }
        Ok(())
    }

    fn recv_discard(&mut self, mut total_bytes: u64, scratch: &mut [u8]) -> Result<(), FlowError> {
        // The inner flow's own discard (a ring's batch, a datagram flow's
        // count of lost bytes), a chunk at a time; bytes counted lost
        // never arrived and cost nothing.
        let chunk = u64::try_from(self.pace.chunk).unwrap_or(u64::MAX).max(1);
        while total_bytes > 0 {
            let part = total_bytes.min(chunk);
            let lost0 = self.inner.lost_bytes();
            self.inner.recv_discard(part, scratch)?;
            let lost = self.inner.lost_bytes().saturating_sub(lost0);
            self.pace.spend(part.saturating_sub(lost))?;
            total_bytes -= part;
        }
        Ok(())
    }

    fn lost_bytes(&self) -> u64 {
        self.inner.lost_bytes()
    }

    fn ready_bytes(&self) -> Option<u64> {
        self.inner.ready_bytes()
    }
}

impl Flow for PacedFlow {
    fn split(&mut self) -> (&mut dyn Sender, &mut dyn Receiver) {
        (&mut self.tx, &mut self.rx)
    }

    fn into_halves(self: Box<Self>) -> (Box<dyn Sender>, Box<dyn Receiver>) {
        (Box::new(self.tx), Box::new(self.rx))
    }

    fn abort_handle(&self) -> Option<AbortHandle> {
        self.abort.clone()
    }

    fn monitor(&self) -> Option<Arc<dyn FlowMonitor>> {
        self.monitor.clone()
    }

    fn reliable(&self) -> bool {
        self.reliable
    }

    fn path_choices(&self) -> Vec<String> {
        self.path_choices.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_waits_only_past_its_burst_and_earns_no_credit_idle() {
        // 1 Gbit/s: 125,000 bytes a millisecond.
        let b = RateBudget::new(1.0);
        assert_eq!(b.bytes_in(Duration::from_millis(1)), 125_000);
        // Within the burst: no wait.
        assert!(b.charge(125_000).is_zero());
        // 100 ms worth at once: about 100 ms less the burst (and the
        // time the test itself took).
        let w = b.charge(12_500_000);
        assert!(
            w > Duration::from_millis(80) && w <= Duration::from_millis(96),
            "{w:?}"
        );
        assert!(!b.ahead().is_zero());
        // A quiet stretch earns nothing past the burst: a budget idle for
        // 50 ms takes 50 ms worth at once, then waits again.
        let b = RateBudget::new(1.0);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!b.charge(6_250_000 + 1_250_000).is_zero());
    }

    #[test]
    fn extreme_rates_and_charges_saturate_instead_of_overflowing() {
        // The fastest rate costs a byte at least a picosecond.
        let fast = RateBudget::new(f64::MAX);
        assert!(fast.charge(1_000).is_zero());
        assert!(fast.charge(u64::MAX) > Duration::from_secs(1));
        let slow = RateBudget::new(1e-9);
        assert!(slow.charge(u64::MAX) > Duration::from_secs(1));
        assert_eq!(PacedFlow::chunk(&slow), 4096);
    }
}
