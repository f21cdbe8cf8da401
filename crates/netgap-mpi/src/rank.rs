//! The two ranks, as `netgap mpi-rank` runs them under mpirun: rank 0 times
//! every repetition and writes [`RankLine`]s to its standard output (mpirun
//! forwards them to the coordinator); rank 1 answers. Both walk the same
//! [`RankPlan`] in the same order, and before every block of iterations
//! rank 0 tells rank 1 how many to run and what they are (uncounted, part
//! of a measured repetition, its start or end; `[0, 0]`: the point is
//! over), so a calibrated count needs no other agreement.
//!
//! The methods are OSU's: latency is a blocking send and receive
//! ping-pong, half the round trip; bandwidth is a window of 64
//! non-blocking sends that rank 1 receives before it sends a 4-byte
//! acknowledgment; bidirectional bandwidth posts a window of receives and
//! of sends on both ranks at once. Warm-up iterations are run before and
//! not counted. A repetition with a time budget runs in chunks until the
//! budget is spent, so a descheduled calibration probe cannot stretch or
//! shrink it; only the chunks are timed.

use crate::kind::{MpiTest, WINDOW};
use crate::wire::{default_warmup, RankIterations, RankLine, RankPlan, MAX_ITERATIONS};
use mpi::point_to_point::Status;
use mpi::topology::{Process, SimpleCommunicator};
use mpi::traits::*;
use netgap_core::cpu::CpuUsage;
use netgap_core::stats::LatencyHistogram;
use netgap_transport::cpu::CpuMeter;
use std::io::Write as _;
use std::time::Instant;

const TAG_CONTROL: i32 = 1;
const TAG_DATA: i32 = 2;
const TAG_ACK: i32 = 3;
const TAG_NAME: i32 = 4;
const TAG_CPU: i32 = 5;
/// Bytes of `mpi-bw`'s acknowledgment (OSU's is 4 bytes too).
const ACK_BYTES: usize = 4;
/// Calibration stops probing once a probe lasts this fraction of the
/// budget.
const CALIBRATION_SHARE: u64 = 10;
/// A repetition with a time budget runs in chunks of about this fraction
/// of it, until the budget is spent.
const CHUNKS_PER_BUDGET: u64 = 20;
/// Kinds of rank 0's announcements: `[n, kind]`; `[0, UNCOUNTED]` ends a
/// point.
const UNCOUNTED: u64 = 0;
/// A chunk of a measured repetition.
const MEASURED: u64 = 1;
/// A measured repetition starts: rank 1 starts its CPU meter.
const REP_START: u64 = 2;
/// A measured repetition ended: rank 1 sends its CPU reading.
const REP_END: u64 = 3;

/// How long a measured repetition runs.
#[derive(Debug, Clone, Copy)]
enum RepLength {
    /// Exactly this many iterations, in one chunk.
    Iterations(u64),
    /// Chunks of `chunk` iterations until `budget_ns` of them are spent.
    Budget { budget_ns: u64, chunk: u64 },
}

/// Why a rank could not run.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// MPI could not be initialized (run under mpirun?).
    #[error("MPI could not be initialized (is this running under mpirun?)")]
    Init,
    /// The job does not have exactly two ranks.
    #[error("the MPI tests need exactly 2 ranks, this job has {0} (mpirun -np 2)")]
    Ranks(i32),
    /// The coordinator stopped reading.
    #[error("writing results: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs this process's rank of `plan`. Returns when every point is done.
pub fn rank_main(plan: &RankPlan) -> Result<(), RankError> {
    let universe = mpi::initialize().ok_or(RankError::Init)?;
    let world = universe.world();
    if world.size() != 2 {
        return Err(RankError::Ranks(world.size()));
    }
    let me = Rank::new(&world);
    if world.rank() == 0 {
        me.lead(plan)
    } else {
        me.answer(plan);
        Ok(())
    }
}

/// One rank's buffers and its peer.
struct Rank<'w> {
    peer: Process<'w>,
}

impl<'w> Rank<'w> {
    fn new(world: &'w SimpleCommunicator) -> Rank<'w> {
        let other = 1 - world.rank();
        Rank {
            peer: world.process_at_rank(other),
        }
    }

    /// Rank 0: times the points and reports them.
    fn lead(&self, plan: &RankPlan) -> Result<(), RankError> {
        let (peer_name, _) = self.peer.receive_vec_with_tag::<u8>(TAG_NAME);
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .chars()
            .take(1024)
            .collect();
        let (major, minor) = mpi::environment::version();
        let processors = vec![
            mpi::environment::processor_name().unwrap_or_default(),
            String::from_utf8_lossy(&peer_name)
                .chars()
                .take(256)
                .collect(),
        ];
        let mut out = std::io::stdout().lock();
        let mut say = |line: RankLine| -> Result<(), RankError> {
            writeln!(out, "{}", line.to_line())?;
            out.flush()?;
            Ok(())
        };
        say(RankLine::Hello {
            library,
            mpi_version: format!("{major}.{minor}"),
            processors,
        })?;
        for (index, p) in plan.points.iter().enumerate() {
            let mut bufs = Buffers::new(p.test, p.size_bytes, true);
            let mut hist = LatencyHistogram::new();
            let mut warmup_iterations = 0;
            let warmup = plan
                .warmup
                .unwrap_or_else(|| default_warmup(p.test, p.size_bytes));
            if warmup > 0 {
                self.block(&mut bufs, warmup, None);
                warmup_iterations += warmup;
            }
            let length = match plan.iterations {
                RankIterations::Fixed(n) => RepLength::Iterations(n),
                RankIterations::BudgetUs(us) => {
                    let budget_ns = us.saturating_mul(1_000);
                    // Probes of doubling length until one lasts a tenth of
                    // the budget; its rate sizes the chunks a repetition
                    // runs until the budget is spent.
                    let mut probe = 1u64;
                    loop {
                        let ns = self.block(&mut bufs, probe, None).max(1);
                        warmup_iterations += probe;
                        if ns >= budget_ns / CALIBRATION_SHARE || probe >= MAX_ITERATIONS / 2 {
                            let per_ns = (ns / probe).max(1);
                            let chunk =
                                (budget_ns / CHUNKS_PER_BUDGET / per_ns).clamp(1, MAX_ITERATIONS);
                            break RepLength::Budget { budget_ns, chunk };
                        }
                        probe *= 2;
                    }
                }
            };
            for rep in 0..plan.reps {
                let (iterations, elapsed_ns, cpu_rank0, cpu_rank1) =
                    self.measured_rep(&mut bufs, length, &mut hist);
                say(RankLine::Rep {
                    point: index as u32,
                    rep,
                    iterations,
                    elapsed_ns: elapsed_ns.max(1),
                    cpu_rank0,
                    cpu_rank1,
                })?;
            }
            self.peer.send_with_tag(&[0u64, UNCOUNTED][..], TAG_CONTROL);
            say(RankLine::Done {
                point: index as u32,
                warmup_iterations,
                rtt_buckets: hist.buckets(),
            })?;
        }
        Ok(())
    }

    /// Rank 1: runs each block rank 0 announces.
    fn answer(&self, plan: &RankPlan) {
        let name = mpi::environment::processor_name().unwrap_or_default();
        self.peer.send_with_tag(name.as_bytes(), TAG_NAME);
        for p in &plan.points {
            let mut bufs = Buffers::new(p.test, p.size_bytes, false);
            let mut meter = None;
            loop {
                let mut control = [0u64; 2];
                self.peer
                    .receive_into_with_tag(&mut control[..], TAG_CONTROL);
                match control {
                    [0, REP_START] => meter = Some(CpuMeter::start()),
                    [0, REP_END] => {
                        let u = meter.take().map(|m| m.stop(0)).unwrap_or_default();
                        // No softirq share travels as NaN.
                        let report = [
                            u.system_busy_percent.to_bits(),
                            u.process_percent.to_bits(),
                            u.cpu_ns,
                            u.wall_ns,
                            u.softirq_percent.unwrap_or(f64::NAN).to_bits(),
                        ];
                        self.peer.send_with_tag(&report[..], TAG_CPU);
                    }
                    [0, _] => break,
                    [n, _] => self.run(&mut bufs, n.min(MAX_ITERATIONS), None),
                }
            }
        }
    }

    /// Rank 0: announces and times `n` uncounted iterations; nanoseconds.
    fn block(&self, bufs: &mut Buffers, n: u64, hist: Option<&mut LatencyHistogram>) -> u64 {
        self.peer.send_with_tag(&[n, UNCOUNTED][..], TAG_CONTROL);
        let t = Instant::now();
        self.run(bufs, n, hist);
        u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Rank 0: one measured repetition of `length`, timed chunk by chunk
    /// (the announcements between chunks are not timed), with the CPU both
    /// ranks spent on it (rank 1 sends its reading after the repetition);
    /// iterations, nanoseconds and the two readings.
    fn measured_rep(
        &self,
        bufs: &mut Buffers,
        length: RepLength,
        hist: &mut LatencyHistogram,
    ) -> (u64, u64, CpuUsage, CpuUsage) {
        self.peer.send_with_tag(&[0, REP_START][..], TAG_CONTROL);
        let meter = CpuMeter::start();
        let (mut iterations, mut elapsed_ns) = (0u64, 0u64);
        loop {
            let chunk = match length {
                RepLength::Iterations(n) => n,
                RepLength::Budget { chunk, .. } => chunk,
            };
            self.peer.send_with_tag(&[chunk, MEASURED][..], TAG_CONTROL);
            let t = Instant::now();
            self.run(bufs, chunk, Some(hist));
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            elapsed_ns = elapsed_ns.saturating_add(ns);
            iterations = iterations.saturating_add(chunk);
            let done = match length {
                RepLength::Iterations(_) => true,
                RepLength::Budget { budget_ns, .. } => elapsed_ns >= budget_ns,
            };
            if done || iterations >= MAX_ITERATIONS {
                break;
            }
        }
        let mine = meter.stop(0);
        self.peer.send_with_tag(&[0, REP_END][..], TAG_CONTROL);
        let mut report = [0u64; 5];
        self.peer.receive_into_with_tag(&mut report[..], TAG_CPU);
        let softirq = f64::from_bits(report[4]);
        let theirs = CpuUsage {
            system_busy_percent: f64::from_bits(report[0]),
            process_percent: f64::from_bits(report[1]),
            cpu_ns: report[2],
            wall_ns: report[3],
            softirq_percent: (!softirq.is_nan()).then_some(softirq),
        };
        (iterations, elapsed_ns, mine, theirs)
    }

    /// `n` iterations of the point's exchange, in this rank's part.
    fn run(&self, b: &mut Buffers, n: u64, mut hist: Option<&mut LatencyHistogram>) {
        let p = &self.peer;
        for _ in 0..n {
            match (b.test, b.leads) {
                (MpiTest::Latency, true) => {
                    let t = Instant::now();
                    p.send_with_tag(&b.send[..], TAG_DATA);
                    p.receive_into_with_tag(&mut b.recv[..], TAG_DATA);
                    if let Some(h) = hist.as_deref_mut() {
                        h.record_ns(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                }
                (MpiTest::Latency, false) => {
                    p.receive_into_with_tag(&mut b.recv[..], TAG_DATA);
                    p.send_with_tag(&b.send[..], TAG_DATA);
                }
                (MpiTest::Bandwidth, true) => {
                    let send = &b.send[..];
                    mpi::request::multiple_scope(WINDOW as usize, |scope, coll| {
                        for _ in 0..WINDOW {
                            coll.add(p.immediate_send_with_tag(scope, send, TAG_DATA));
                        }
                        wait(coll);
                    });
                    p.receive_into_with_tag(&mut b.ack[..], TAG_ACK);
                }
                (MpiTest::Bandwidth, false) => {
                    let size = b.size;
                    mpi::request::multiple_scope(WINDOW as usize, |scope, coll| {
                        for chunk in b.recv.chunks_mut(size) {
                            coll.add(p.immediate_receive_into_with_tag(scope, chunk, TAG_DATA));
                        }
                        wait(coll);
                    });
                    p.send_with_tag(&b.ack[..], TAG_ACK);
                }
                (MpiTest::Bidirectional, _) => {
                    let (size, send) = (b.size, &b.send[..]);
                    mpi::request::multiple_scope(2 * WINDOW as usize, |scope, coll| {
                        for chunk in b.recv.chunks_mut(size) {
                            coll.add(p.immediate_receive_into_with_tag(scope, chunk, TAG_DATA));
                        }
                        for _ in 0..WINDOW {
                            coll.add(p.immediate_send_with_tag(scope, send, TAG_DATA));
                        }
                        wait(coll);
                    });
                }
            }
        }
    }
}

/// Waits for every request of a window.
fn wait<'a>(coll: &mut mpi::request::RequestCollection<'a, [u8]>) {
    let mut done: Vec<(usize, Status, &'a [u8])> = Vec::with_capacity(2 * WINDOW as usize);
    coll.wait_all(&mut done);
}

/// The buffers of one point on one rank.
struct Buffers {
    test: MpiTest,
    leads: bool,
    size: usize,
    send: Vec<u8>,
    /// One message for latency; a window of them for a receiving
    /// bandwidth rank (non-blocking receives each need their own).
    recv: Vec<u8>,
    ack: [u8; ACK_BYTES],
}

impl Buffers {
    fn new(test: MpiTest, size_bytes: u64, leads: bool) -> Buffers {
        // The plan was checked: sizes are at most MAX_MPI_SIZE_BYTES.
        let size = usize::try_from(size_bytes).unwrap_or(1).max(1);
        let window = WINDOW as usize;
        let (send, recv) = match (test, leads) {
            (MpiTest::Latency, _) => (size, size),
            (MpiTest::Bandwidth, true) => (size, 0),
            (MpiTest::Bandwidth, false) => (0, size * window),
            (MpiTest::Bidirectional, _) => (size, size * window),
        };
        Buffers {
            test,
            leads,
            size,
            send: vec![b'n'; send],
            recv: vec![0; recv],
            ack: [0; ACK_BYTES],
        }
    }
}
