//! The two ranks, as `netgap mpi-rank` runs them under mpirun: rank 0 times
//! every repetition and writes [`RankLine`]s to its standard output (mpirun
//! forwards them to the coordinator); rank 1 answers. Both walk the same
//! [`RankPlan`] in the same order, and before every block of iterations
//! rank 0 tells rank 1 how many to run (0: the point is over), so a
//! calibrated iteration count needs no other agreement.
//!
//! The methods are OSU's: latency is a blocking send and receive
//! ping-pong, half the round trip; bandwidth is a window of 64
//! non-blocking sends that rank 1 receives before it sends a 4-byte
//! acknowledgment; bidirectional bandwidth posts a window of receives and
//! of sends on both ranks at once. Warm-up iterations are run before and
//! not counted.

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
            let iterations = match plan.iterations {
                RankIterations::Fixed(n) => n,
                RankIterations::BudgetUs(us) => {
                    let budget_ns = us.saturating_mul(1_000);
                    // Probes of doubling length; the fastest per-iteration
                    // time of any probe sets the count, so one probe that a
                    // descheduling stretched does not shrink every
                    // repetition to a few iterations.
                    let mut probe = 1u64;
                    let mut best_per_ns = u64::MAX;
                    loop {
                        let ns = self.block(&mut bufs, probe, None).max(1);
                        warmup_iterations += probe;
                        best_per_ns = best_per_ns.min((ns / probe).max(1));
                        if ns >= budget_ns / CALIBRATION_SHARE || probe >= MAX_ITERATIONS / 2 {
                            break (budget_ns / best_per_ns).clamp(1, MAX_ITERATIONS);
                        }
                        probe *= 2;
                    }
                }
            };
            for rep in 0..plan.reps {
                let (elapsed_ns, cpu_rank0, cpu_rank1) =
                    self.measured_block(&mut bufs, iterations, &mut hist);
                say(RankLine::Rep {
                    point: index as u32,
                    rep,
                    iterations,
                    elapsed_ns: elapsed_ns.max(1),
                    cpu_rank0,
                    cpu_rank1,
                })?;
            }
            self.peer.send_with_tag(&[0u64, 0][..], TAG_CONTROL);
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
            loop {
                let mut control = [0u64; 2];
                self.peer
                    .receive_into_with_tag(&mut control[..], TAG_CONTROL);
                let [n, measured] = control;
                if n == 0 {
                    break;
                }
                if measured == 0 {
                    self.run(&mut bufs, n.min(MAX_ITERATIONS), None);
                    continue;
                }
                let meter = CpuMeter::start();
                self.run(&mut bufs, n.min(MAX_ITERATIONS), None);
                let u = meter.stop(0);
                let report = [
                    u.system_busy_percent.to_bits(),
                    u.process_percent.to_bits(),
                    u.cpu_ns,
                    u.wall_ns,
                ];
                self.peer.send_with_tag(&report[..], TAG_CPU);
            }
        }
    }

    /// Rank 0: announces and times `n` uncounted iterations; nanoseconds.
    fn block(&self, bufs: &mut Buffers, n: u64, hist: Option<&mut LatencyHistogram>) -> u64 {
        self.peer.send_with_tag(&[n, 0][..], TAG_CONTROL);
        let t = Instant::now();
        self.run(bufs, n, hist);
        u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Rank 0: announces and times `n` measured iterations, with the CPU
    /// both ranks spent on them (rank 1 sends its reading after the timed
    /// part); nanoseconds and the two readings.
    fn measured_block(
        &self,
        bufs: &mut Buffers,
        n: u64,
        hist: &mut LatencyHistogram,
    ) -> (u64, CpuUsage, CpuUsage) {
        self.peer.send_with_tag(&[n, 1][..], TAG_CONTROL);
        let meter = CpuMeter::start();
        let t = Instant::now();
        self.run(bufs, n, Some(hist));
        let elapsed_ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mine = meter.stop(0);
        let mut report = [0u64; 4];
        self.peer.receive_into_with_tag(&mut report[..], TAG_CPU);
        let theirs = CpuUsage {
            system_busy_percent: f64::from_bits(report[0]),
            process_percent: f64::from_bits(report[1]),
            cpu_ns: report[2],
            wall_ns: report[3],
        };
        (elapsed_ns, mine, theirs)
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
